#include "http/tls.h"

#include "http/bearer_token.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <unistd.h>

#include <cstdlib>
#include <mutex>

namespace tessera::http {

void SslCtxFree::operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }

std::string TakeSslError() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

Result<SslCtxPtr> MakeServerContext(const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() || key_file.empty()) {
    return InvalidArgument("TLS needs both a certificate and a key (--tls-cert and --tls-key)",
                           {{"field", cert_file.empty() ? "tls-cert" : "tls-key"}});
  }
  ERR_clear_error();
  SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) return Internal("cannot create a TLS context: " + TakeSslError());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // Writes are retried from the caller's loop, whose buffer may have moved.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert_file.c_str()) != 1) {
    return InvalidArgument("cannot load the TLS certificate " + cert_file + ": " + TakeSslError(),
                           {{"field", "tls-cert"}, {"file", cert_file}});
  }
  // A private key that other users could read is no longer private.
  if (::access(key_file.c_str(), F_OK) == 0) {
    RETURN_IF_ERROR(CheckOwnerOnly(key_file, "the TLS key", "tls-key"));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return InvalidArgument("cannot load the TLS key " + key_file + ": " + TakeSslError(),
                           {{"field", "tls-key"}, {"file", key_file}});
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    return InvalidArgument("the TLS key " + key_file + " does not match the certificate " +
                               cert_file + ": " + TakeSslError(),
                           {{"field", "tls-key"}, {"file", key_file}});
  }
  return ctx;
}

namespace {
std::mutex ca_mu;
std::string ca_file;
bool ca_set = false;
}  // namespace

void SetDefaultCaFile(const std::string& path) {
  std::lock_guard<std::mutex> l(ca_mu);
  ca_file = path;
  ca_set = !path.empty();
}

std::string DefaultCaFile() {
  std::lock_guard<std::mutex> l(ca_mu);
  if (ca_set) return ca_file;
  const char* env = std::getenv("TESSERA_TLS_CA");
  return env != nullptr ? env : "";
}

}  // namespace tessera::http
