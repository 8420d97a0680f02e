// The front of an HTTP server: one thread that accepts connections, completes
// TLS handshakes and waits, with epoll, until a connection holds a whole
// request header, and only then hands it to a handler thread. A client that
// trickles its header (or sends nothing) therefore costs a file descriptor and
// a few bytes, never a thread, and is dropped when its header deadline passes.
// Connections waiting here are capped per peer address and in all; over a cap,
// the connection that has waited longest goes. A header that `screen` refuses
// (a request without its credential) is answered here too, and its connection
// drained briefly and closed: such a peer never gets a thread either.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "http/connection.h"
#include "api/status.h"
#include "api/thread_annotations.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace tessera::http {

struct GateOptions {
  int header_timeout_ms = 10000;       // a whole request header (and TLS handshake)
  int idle_timeout_ms = 5000;          // a kept-alive connection between requests
  size_t max_header_bytes = 64 << 10;  // larger: 431
  size_t max_waiting_per_peer = 1024;
  size_t max_waiting = 16384;
  // Given a connection holding a whole request header `head`, the complete response
  // to send instead of dispatching it (the connection is then closed); nullopt:
  // dispatch. What it decides about the request may travel on the connection.
  std::function<std::optional<std::string>(Conn& c, std::string_view head)> screen;
};

struct GateStats {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> header_timeouts{0};  // dropped with 408: header not complete in time
  std::atomic<uint64_t> evicted{0};          // dropped over a cap
  std::atomic<uint64_t> header_too_large{0};
  std::atomic<uint64_t> tls_failures{0};     // handshakes that failed
  std::atomic<uint64_t> screened{0};         // answered here by GateOptions::screen
  std::atomic<uint64_t> waiting{0};          // now
};

class Gate {
 public:
  using Dispatch = std::function<void(std::shared_ptr<Conn>)>;
  // `listen_fd` (non-blocking, listening) stays the caller's; `tls` may be null.
  Gate(int listen_fd, SSL_CTX* tls, GateOptions options, Dispatch dispatch);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  Status Start();
  // Stops the thread and closes every connection waiting here.
  void Stop();
  // A connection a handler is done with, to wait for its next request.
  void Return(std::shared_ptr<Conn> c);
  const GateStats& stats() const { return stats_; }

 private:
  void Loop();
  void AcceptAll(int64_t now);
  void Adopt(std::shared_ptr<Conn> c, int64_t now);
  // Reads (or handshakes) what the connection has; dispatches it once a header is whole.
  void Advance(int fd, int64_t now);
  void Watch(Conn& c, bool want_write);
  void Drop(int fd);
  void Refuse(int fd, int status, const char* reason);
  void ExpireAll(int64_t now);
  void EnforceCaps(const std::string& peer);
  void PauseAccept(int64_t now);
  // Sends `response` and keeps reading (and dropping) what the peer still sends
  // for a moment, so that closing does not reset the connection before the peer
  // read the answer.
  void Answer(int fd, const std::string& response, int64_t now);
  void Drain(int fd, int64_t now);

  const int listen_fd_;
  SSL_CTX* const tls_;
  const GateOptions options_;
  Dispatch dispatch_;
  GateStats stats_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  uint64_t next_seq_ = 0;
  int64_t accept_paused_until_ = 0;
  // Owned by the gate thread.
  std::unordered_map<int, std::shared_ptr<Conn>> waiting_;
  std::map<uint64_t, int> order_;  // seq -> fd, oldest first
  std::unordered_map<std::string, std::map<uint64_t, int>> by_peer_;
  // Answered connections being drained before they close: fd → (conn, until).
  std::unordered_map<int, std::pair<std::shared_ptr<Conn>, int64_t>> draining_;
  // Connections handed back by handler threads.
  Mutex returned_mu_;
  std::vector<std::shared_ptr<Conn>> returned_ GUARDED_BY(returned_mu_);
};

}  // namespace tessera::http
