// TLS for the project's HTTP servers and clients (OpenSSL): a server context
// from a certificate chain and key, and the CA file clients verify against.
#pragma once

#include <memory>
#include <string>

#include "api/status.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace tessera::http {

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const;
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;

// A TLS 1.2+ server context from PEM files; errors name the file and OpenSSL's reason.
Result<SslCtxPtr> MakeServerContext(const std::string& cert_file, const std::string& key_file);

// OpenSSL's error queue as one line (and cleared); "" when empty.
std::string TakeSslError();

// The CA bundle clients verify https:// servers against: the last SetDefaultCaFile,
// else $TESSERA_TLS_CA, else "" (the system's default store).
void SetDefaultCaFile(const std::string& path);
std::string DefaultCaFile();

}  // namespace tessera::http
