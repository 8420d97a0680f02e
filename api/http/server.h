// An HTTP server around a Router with the project's one error policy: every
// failure is API.md's JSON error, an exception handler catches the rest, body
// size and timeouts are bounded, the thread pool is sized explicitly (long-polls
// and barriers block threads), and /api/v1/* routes need the bearer token.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "api/http/router.h"
#include "api/status.h"

namespace httplib {
class Server;
}

namespace tessera::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                          // 0: any free port
  int threads = 32;
  size_t max_body_bytes = 64ull << 20;   // larger bodies get 413 payload_too_large
  std::string token;                     // empty: no auth
  int read_timeout_s = 30;
  int write_timeout_s = 30;
  // How long an idle keep-alive connection stays open. cpp-httplib watches
  // each one by polling every ~10 ms, so idle connections cost CPU: keep it short.
  int keep_alive_timeout_s = 1;
  // Called after every request: the route pattern ("" if none), status, duration.
  std::function<void(const Request&, const std::string& pattern, int status, double ms)> on_request;
};

class Server {
 public:
  Server(std::shared_ptr<Router> router, ServerOptions options);
  ~Server();

  // Binds the socket; returns the bound port.
  Result<int> Bind();
  // Serves in a background thread. REQUIRES: Bind() ok.
  void Start();
  // Serves on the calling thread until Stop().
  void Run();
  void Stop();
  int port() const { return port_; }

 private:
  // `body`: the request body when it was read by a content reader (else hreq's).
  void Handle(const void* raw_req, void* raw_res, std::string* body = nullptr);

  std::shared_ptr<Router> router_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  int listen_fd_ = -1;  // the listening socket, once bound
  static constexpr int kListenBacklog = 1024;
};

// Constant-time check of "Authorization: Bearer <token>".
bool BearerMatches(const std::string& header, const std::string& token);

}  // namespace tessera::http
