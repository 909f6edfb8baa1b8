// RapidJSON helpers the parts of the wire codec share (codec_infer.cpp: inference; codec_shm.cpp: shared
// memory; codec_admin.cpp: config, statistics, metadata, the repository index): private to them, so that
// RapidJSON stays behind the codec files. Inline functions of their arguments; thread-safe, no state.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "codec.h"
#include "types.h"

namespace aotc::server::codec::json {

using rapidjson::Value;
// NaN and infinities are written as such (NaN, Infinity): FP32/FP64 outputs may hold them.
using Writer = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                                 rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>;

// Refuses text nesting deeper than kMaxJsonDepth before RapidJSON sees it, so that a JSON bomb cannot
// exhaust the stack.
inline void check_depth(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw bad_request("request JSON nests deeper than " + std::to_string(kMaxJsonDepth) +
                          " levels; expected a flat or shape-nested tensor");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// Parses `text` (NaN and infinities allowed) into `doc`, which must be an object; `what` names it in errors.
inline void parse_document(rapidjson::Document& doc, std::string_view text, const char* what) {
  check_depth(text);
  doc.Parse<rapidjson::kParseNanAndInfFlag>(text.data(), text.size());
  if (doc.HasParseError())
    throw bad_request(std::string(what) + " is not valid JSON (error at byte " +
                      std::to_string(doc.GetErrorOffset()) + ")");
  if (!doc.IsObject()) throw bad_request(std::string(what) + " must be a JSON object");
}

// A JSON string's bytes, all of them: GetString() alone would stop at an escaped NUL ("a\u0000b" -> "a").
inline std::string str(const Value& v) { return std::string(v.GetString(), v.GetStringLength()); }

inline const Value* member(const Value& obj, const char* key) {
  auto it = obj.FindMember(key);
  return it == obj.MemberEnd() ? nullptr : &it->value;
}

// A required string field of `obj`; `where` names the object in the error.
inline std::string require_string(const Value& obj, const char* key, const std::string& where) {
  const Value* v = member(obj, key);
  if (!v || !v->IsString()) throw bad_request(where + ": missing string field '" + key + "'");
  return str(*v);
}

// An optional integer parameter; 400 when it is there but not an integer.
inline std::optional<int64_t> int_param(const Value* params, const char* key, const std::string& where) {
  if (!params) return std::nullopt;
  const Value* v = member(*params, key);
  if (!v) return std::nullopt;
  if (!v->IsInt64()) throw bad_request(where + ": parameter '" + key + "' must be an integer");
  return v->GetInt64();
}

// config.json's "model_warmup" (codec_warmup.cpp). Throws ServeError(400) naming the bad field.
std::vector<WarmupSample> parse_model_warmup(const Value& v);
void write_model_warmup(Writer& w, const std::vector<WarmupSample>& samples);

inline void write_shape(Writer& w, const std::vector<int64_t>& shape) {
  w.StartArray();
  for (int64_t d : shape) w.Int64(d);
  w.EndArray();
}

// The length of the well-formed UTF-8 sequence that begins at s[i] (Unicode's table 3-7: no overlong forms,
// no surrogates, nothing past U+10FFFF), or 0 when none does.
inline size_t utf8_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) n = 3, lo = 0xA0;
  else if (c == 0xED) n = 3, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) n = 3;
  else if (c == 0xF0) n = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else if (c == 0xF4) n = 4, hi = 0x8F;
  else return 0;
  if (s.size() - i < n || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

// Writes text that may hold a client's bytes (a name, an id, an error quoting them) as a JSON string that is
// valid UTF-8 whatever those bytes were: each byte that is not part of well-formed UTF-8 becomes the four
// characters \xNN (Python's "backslashreplace"), so the name stays recognisable. Embedded NULs are kept
// (RapidJSON escapes them).
inline void write_text(Writer& w, std::string_view s) {
  size_t i = 0, n = 0;
  while (i < s.size() && (n = utf8_length(s, i))) i += n;
  if (i == s.size()) {
    w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
    return;
  }
  static const char hex[] = "0123456789abcdef";
  std::string out(s.substr(0, i));
  while (i < s.size()) {
    if ((n = utf8_length(s, i))) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      const auto c = static_cast<unsigned char>(s[i++]);
      out += {'\\', 'x', hex[c >> 4], hex[c & 15]};
    }
  }
  w.String(out.data(), static_cast<rapidjson::SizeType>(out.size()));
}

inline std::string done(rapidjson::StringBuffer& sb) { return std::string(sb.GetString(), sb.GetSize()); }

}  // namespace aotc::server::codec::json
