// Incremental SHA-256 over OpenSSL's libcrypto (EVP). One object per stream; not thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace aotc {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t n);
  std::string hex_digest();  // lower-case hex; ends the stream

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string sha256_hex(const void* data, size_t n);

}  // namespace aotc
