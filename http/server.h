// An HTTP(S) server around a Router with the project's one error policy: every
// failure is docs/openapi.json's JSON error, an exception handler catches the rest, and
// /api/v1/* routes need the bearer token. Hostile clients are bounded: a
// connection gets a handler thread only once its whole header has arrived
// (gate.h), headers and bodies have deadlines, sizes are capped, and a
// reserved pool keeps threads for worker traffic.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "http/admission.h"
#include "http/router.h"

namespace httplib {
class ThreadPool;
}
typedef struct ssl_ctx_st SSL_CTX;

namespace tessera::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                          // 0: any free port
  int threads = 32;                      // handler threads (long-polls and barriers hold one)
  size_t max_body_bytes = 64ull << 20;   // larger bodies get 413 payload_too_large
  // The body limit of routes that set no Route::body_limit (JSON routes). A declared
  // Content-Length over a route's limit gets 413 before any byte of the body is
  // read, and so does a request without the token on a route that needs it (401).
  size_t max_json_body_bytes = 4ull << 20;
  std::string token;                     // empty: no auth
  std::string token_hint;                // where a client finds the token, for the 401 message
  int read_timeout_s = 30;               // no byte of a body for this long: the request fails
  int write_timeout_s = 30;              // no byte of a response moves for this long: dropped
  int header_timeout_s = 10;             // a whole request header must arrive within this
  int body_timeout_s = 300;              // a whole request (header and body) within this
  // How long an idle kept-alive connection stays open. It waits in the gate's
  // epoll set, not on a thread, so it costs only its descriptor.
  int keep_alive_timeout_s = 5;
  size_t max_header_bytes = 64 << 10;    // larger headers get 431
  // Connections waiting for their request, per peer address and in all; over
  // a cap, the one that has waited longest is closed.
  size_t max_waiting_per_peer = 1024;
  size_t max_waiting = 16384;
  // Requests whose path starts with `reserved_prefix` (and that carry the
  // token, when there is one) run on `reserved_threads` threads of their own,
  // so that other clients cannot take every handler thread from them.
  std::string reserved_prefix;
  int reserved_threads = 4;
  // HTTPS when both are set (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // Called after every request: the route pattern ("" if none), status, duration.
  std::function<void(const Request&, const std::string& pattern, int status, double ms)> on_request;
};

// What the server has refused or dropped, for metrics.
struct ServerStats {
  uint64_t waiting = 0;           // connections waiting for a request now
  uint64_t header_timeouts = 0;   // closed with 408: header not whole in time
  uint64_t evicted = 0;           // closed over a connection cap
  uint64_t header_too_large = 0;  // closed with 431
  uint64_t tls_failures = 0;      // failed TLS handshakes
  uint64_t unauthenticated_at_gate = 0;  // answered 401 from their header, no thread spent
};

class BodyReader;
class Gate;
class HttplibBridge;
struct Answer;
struct Conn;

class Server {
 public:
  Server(std::shared_ptr<Router> router, ServerOptions options);
  ~Server();

  // Binds the socket (and loads the TLS certificate); returns the bound port.
  Result<int> Bind();
  // Serves in background threads. REQUIRES: Bind() ok.
  void Start();
  // Serves until Stop().
  void Run();
  void Stop();
  int port() const { return port_; }
  bool tls() const { return !options_.tls_cert_file.empty(); }
  // ServerOptions::token_hint, once known (it may name the bound port). Before Start().
  void set_token_hint(std::string hint) { options_.token_hint = std::move(hint); }
  ServerStats stats() const;

 private:
  // Decides on the request header `head` that `c` holds, once (admission.h), and
  // leaves the decision on `c` for the thread that serves it.
  void Admit(Conn& c, std::string_view head) const;
  // For the gate: admits the header `c` holds, and returns the whole 401 response
  // when its route needs a credential it lacks; nullopt to dispatch it to a thread.
  std::optional<std::string> Screen(Conn& c, std::string_view head) const;
  void Dispatch(std::shared_ptr<Conn> c);
  // Serves requests on `c` until it closes or has to wait for its next one.
  void Serve(std::shared_ptr<Conn> c);
  // Answers one request from what was decided at its admission (null: its header
  // did not parse; its request is moved out) and, where the header alone does not
  // decide, its body.
  Answer Respond(Admission* admission, BodyReader& body) const;
  // Reads the body of a request for `route` into `req`: ok, or the refusal that was
  // decided from its header (or once it passed the route's limit).
  Status ReadBody(const Route& route, BodyReader& body, Request* req) const;
  // The 401 of a request without its credential.
  Status Unauthorized() const;

  std::shared_ptr<Router> router_;
  ServerOptions options_;
  AdmissionPolicy policy_;
  std::unique_ptr<HttplibBridge> bridge_;
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> tls_;
  std::unique_ptr<Gate> gate_;
  std::unique_ptr<httplib::ThreadPool> pool_;
  std::unique_ptr<httplib::ThreadPool> reserved_pool_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> started_{false};
  Mutex lifecycle_mu_;  // Start and Stop, one at a time: taken before mu_
  Mutex mu_;
  CondVar stopped_cv_;  // stopping_ set, or active_ shrank
  std::set<Conn*> active_ GUARDED_BY(mu_);  // connections a handler is serving
  static constexpr int kListenBacklog = 1024;
  static constexpr int kMaxRequestsPerConnection = 1000;
  static constexpr int kStopGraceMs = 2000;
};

}  // namespace tessera::http
