#include "collectives/transport/tcp/auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <memory>
#include <string>

namespace tessera::collectives {
namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  ERR_clear_error();
  return text;
}

}  // namespace

Result<DataPortKey> DeriveDataPortKey(std::string_view token) {
  std::unique_ptr<EVP_KDF, decltype(&EVP_KDF_free)> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr),
                                                        EVP_KDF_free);
  if (kdf == nullptr) return Internal("HKDF is not available: " + OpenSslError());
  std::unique_ptr<EVP_KDF_CTX, decltype(&EVP_KDF_CTX_free)> ctx(EVP_KDF_CTX_new(kdf.get()),
                                                                EVP_KDF_CTX_free);
  if (ctx == nullptr) return Internal("HKDF: " + OpenSslError());
  // OSSL_PARAM wants non-const pointers; nothing writes through them.
  char digest[] = "SHA256";
  // An empty token is still a key (HKDF allows an empty input keying material);
  // a non-null pointer keeps OpenSSL from treating it as missing.
  static const char kEmpty[1] = {0};
  void* ikm = const_cast<char*>(token.empty() ? kEmpty : token.data());
  void* info = const_cast<char*>(kDataPortKeyInfo.data());
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, ikm, token.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, kDataPortKeyInfo.size()),
      OSSL_PARAM_construct_end()};
  DataPortKey key;
  if (EVP_KDF_derive(ctx.get(), key.bytes.data(), key.bytes.size(), params) != 1) {
    return Internal("deriving the data-port key: " + OpenSslError());
  }
  return key;
}

Result<DataPortKey> RandomDataPortKey() {
  DataPortKey key;
  RETURN_IF_ERROR(RandomBytes(key.bytes));
  return key;
}

Result<Mac> HmacSha256(const DataPortKey& key,
                       std::span<const std::span<const uint8_t>> parts) {
  Mac mac{};
  std::string data;
  for (std::span<const uint8_t> part : parts) {
    data.append(reinterpret_cast<const char*>(part.data()), part.size());
  }
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac.data(),
           &n) == nullptr ||
      n != mac.size()) {
    return Internal("HMAC-SHA256: " + OpenSslError());
  }
  return mac;
}

Status RandomBytes(std::span<uint8_t> out) {
  if (out.empty()) return Status::Ok();
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return Internal("no random bytes: " + OpenSslError());
  }
  return Status::Ok();
}

bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tessera::collectives
