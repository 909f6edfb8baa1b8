// SHA-256 through OpenSSL's EVP interface (libcrypto only, no TLS).
#include "sha256.h"

#include <openssl/evp.h>

#include "aotc/runtime.h"

namespace aotc {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(new Ctx) {
  ctx_->md = EVP_MD_CTX_new();
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) {
    throw Error(Error::Kind::Internal, "sha256: OpenSSL could not initialise a digest");
  }
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t n) {
  if (n > 0 && EVP_DigestUpdate(ctx_->md, data, n) != 1) {
    throw Error(Error::Kind::Internal, "sha256: OpenSSL digest update failed");
  }
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_->md, digest, &len) != 1) {
    throw Error(Error::Kind::Internal, "sha256: OpenSSL digest final failed");
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(hex[digest[i] >> 4]);
    out.push_back(hex[digest[i] & 0xf]);
  }
  return out;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex_digest();
}

}  // namespace aotc
