// RapidJSON helpers the two halves of the wire codec share (codec_infer.cpp: inference and shared memory;
// codec_admin.cpp: config, statistics, metadata, the repository index): private to them, so that RapidJSON
// stays behind the codec files. Inline functions of their arguments; thread-safe, no state.
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

inline const Value* member(const Value& obj, const char* key) {
  auto it = obj.FindMember(key);
  return it == obj.MemberEnd() ? nullptr : &it->value;
}

inline void write_shape(Writer& w, const std::vector<int64_t>& shape) {
  w.StartArray();
  for (int64_t d : shape) w.Int64(d);
  w.EndArray();
}

inline std::string done(rapidjson::StringBuffer& sb) { return std::string(sb.GetString(), sb.GetSize()); }

}  // namespace aotc::server::codec::json
