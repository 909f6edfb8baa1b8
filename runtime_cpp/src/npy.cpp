// .npy reader/writer; see aotc/npy.h for the format subset and why it is our own.
#include "aotc/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>

#include "aotc/runtime.h"

namespace aotc {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

struct Descr {
  const char* descr;
  at::ScalarType type;
};
// bfloat16 has no NumPy dtype: it is written as float32 (exact) and cannot be read back as bfloat16.
constexpr Descr kDescrs[] = {
    {"|b1", at::kBool},  {"|u1", at::kByte},  {"|i1", at::kChar},  {"<i2", at::kShort}, {"<i4", at::kInt},
    {"<i8", at::kLong},  {"<f2", at::kHalf},  {"<f4", at::kFloat}, {"<f8", at::kDouble},
};

[[noreturn]] void bad(const std::string& what, const std::string& why) {
  throw Error(Error::Kind::InvalidInput, what + ": not a readable .npy file: " + why);
}

// The value text after `'key':` in the header dict, up to the next top-level ',' or '}'.
std::string header_value(const std::string& header, const std::string& key, const std::string& what) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) bad(what, "header has no '" + key + "'");
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) bad(what, "header is malformed near '" + key + "'");
  size_t start = colon + 1, depth = 0, i = start;
  for (; i < header.size(); ++i) {
    char c = header[i];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string v = header.substr(start, i - start);
  size_t a = v.find_first_not_of(" \t"), b = v.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : v.substr(a, b - a + 1);
}

}  // namespace

at::Tensor npy_decode(const std::string& bytes, const std::string& what) {
  if (bytes.size() < kMagicLen + 4 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0) {
    bad(what, "missing the \\x93NUMPY magic");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const int major = u[6];
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = u[8] | (u[9] << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(what, "truncated header");
    header_len = u[8] | (u[9] << 8) | (u[10] << 16) | (static_cast<size_t>(u[11]) << 24);
    offset = 12;
  } else {
    bad(what, "format version " + std::to_string(major) + " (expected 1, 2 or 3)");
  }
  if (offset + header_len > bytes.size()) bad(what, "truncated header");
  const std::string header = bytes.substr(offset, header_len);
  offset += header_len;

  std::string descr = header_value(header, "descr", what);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"')) bad(what, "descr is " + descr);
  descr = descr.substr(1, descr.size() - 2);
  if (descr.size() == 3 && descr[0] == '=') descr[0] = '<';  // native order on a little-endian host
  if (descr.size() == 3 && descr[2] == '1' && descr[0] != '|') descr[0] = '|';
  at::ScalarType type = at::kFloat;
  bool known = false;
  for (const auto& d : kDescrs) {
    if (descr == d.descr) {
      type = d.type;
      known = true;
    }
  }
  if (!known) {
    bad(what, "dtype '" + descr + "' is not supported (expected a little-endian bool, int8-64, uint8, float16/32/64)");
  }
  const std::string fortran = header_value(header, "fortran_order", what);
  if (fortran != "False" && fortran != "True") bad(what, "fortran_order is '" + fortran + "'");
  std::string shape_text = header_value(header, "shape", what);
  if (shape_text.size() < 2 || shape_text.front() != '(' || shape_text.back() != ')') {
    bad(what, "shape is '" + shape_text + "', expected a tuple");
  }
  std::vector<int64_t> shape;
  std::stringstream ss(shape_text.substr(1, shape_text.size() - 2));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      size_t used = 0;
      long long n = std::stoll(item, &used);
      if (n < 0 || item.find_first_not_of(" \tL", used) != std::string::npos) throw std::invalid_argument(item);
      shape.push_back(n);
    } catch (const std::exception&) {
      bad(what, "shape entry '" + item + "' is not a size");
    }
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(type);
  if (bytes.size() - offset < nbytes) {
    bad(what, "data is truncated: " + std::to_string(bytes.size() - offset) + " bytes for shape " + shape_text +
                  " of " + descr + " (" + std::to_string(nbytes) + " bytes)");
  }
  if (fortran == "True") {
    // Fortran order is C order of the reversed shape; transpose back and make it C-contiguous.
    std::vector<int64_t> rev(shape.rbegin(), shape.rend());
    at::Tensor t = at::empty(rev, at::TensorOptions().dtype(type));
    std::memcpy(t.data_ptr(), bytes.data() + offset, nbytes);
    std::vector<int64_t> perm;
    for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) perm.push_back(i);
    return t.permute(perm).contiguous();
  }
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  if (nbytes > 0) std::memcpy(t.data_ptr(), bytes.data() + offset, nbytes);
  return t;
}

std::string npy_encode(const at::Tensor& tensor) {
  at::Tensor t = tensor.detach().to(at::kCPU);
  if (t.scalar_type() == at::kBFloat16) t = t.to(at::kFloat);
  t = t.contiguous();
  const char* descr = nullptr;
  for (const auto& d : kDescrs) {
    if (d.type == t.scalar_type()) descr = d.descr;
  }
  if (descr == nullptr) {
    throw Error(Error::Kind::InvalidInput,
                std::string("cannot write dtype ") + c10::toString(t.scalar_type()) + " as .npy");
  }
  std::ostringstream h;
  h << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (int64_t i = 0; i < t.dim(); ++i) h << (i > 0 ? ", " : "") << t.size(i);
  if (t.dim() == 1) h << ',';
  h << "), }";
  std::string header = h.str();
  // Pad with spaces so that the data starts on a 64-byte boundary, as NumPy does.
  size_t total = kMagicLen + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out(kMagic, kMagicLen);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>((header.size() >> 8) & 0xff));
  out += header;
  out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

at::Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(Error::Kind::NotFound, "cannot open '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return npy_decode(ss.str(), "'" + path + "'");
}

void write_npy(const std::string& path, const at::Tensor& tensor) {
  std::string bytes = npy_encode(tensor);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error(Error::Kind::Internal, "cannot write '" + path + "'");
}

}  // namespace aotc
