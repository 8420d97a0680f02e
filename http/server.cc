#include "http/server.h"

#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "api/clock.h"
#include "http/connection.h"
#include "http/gate.h"
#include "http/httplib_bridge.h"
#include "http/tls.h"

namespace tessera::http {

namespace {

// After an answer that left the body unread: stop sending, then read and drop what
// the client still sends for a little while before closing. Closing at once, with
// unread bytes queued, resets the connection, and a client still writing its body
// loses the answer. Bounded in time and bytes, so a slow sender costs this thread
// a second at most, and a silent one 100 ms.
void LingerAndDrop(int fd) {
  constexpr int64_t kLingerMs = 1000;
  constexpr int64_t kIdleMs = 100;
  constexpr size_t kLingerBytes = size_t{64} << 20;
  ::shutdown(fd, SHUT_WR);
  const int64_t until = MonoMs() + kLingerMs;
  char scratch[64 << 10];
  size_t dropped = 0;
  while (dropped < kLingerBytes) {
    const int64_t left = std::min(until - MonoMs(), kIdleMs);
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return;
    const ssize_t n = ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT);
    if (n <= 0) return;
    dropped += static_cast<size_t>(n);
  }
}

// Lets this process hold as many connections as its hard limit allows: the
// default soft limit (1024) is below what the gate is built to hold.
void RaiseFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

BridgeOptions BridgeOptionsOf(const ServerOptions& o, int max_requests) {
  BridgeOptions b;
  b.max_body_bytes = o.max_body_bytes;
  b.keep_alive_timeout_s = o.keep_alive_timeout_s;
  b.max_requests = max_requests;
  b.read_timeout_ms = o.read_timeout_s * 1000;
  b.write_timeout_ms = o.write_timeout_s * 1000;
  return b;
}

}  // namespace

Server::Server(std::shared_ptr<Router> router, ServerOptions options)
    : router_(std::move(router)),
      options_(std::move(options)),
      policy_{options_.token, options_.reserved_prefix},
      bridge_(
          std::make_unique<HttplibBridge>(BridgeOptionsOf(options_, kMaxRequestsPerConnection))),
      tls_(nullptr, SSL_CTX_free) {}

Server::~Server() { Stop(); }

Result<int> Server::Bind() {
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
    ASSIGN_OR_RETURN(SslCtxPtr ctx, MakeServerContext(options_.tls_cert_file, options_.tls_key_file));
    tls_.reset(ctx.release());
  }
  RaiseFileLimit();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(options_.port);
  if (int rc = ::getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Unavailable("cannot listen on " + where + ": " + gai_strerror(rc), {{"field", "listen"}});
  }
  std::string err = "no address";
  for (addrinfo* ai = res; ai != nullptr && listen_fd_ < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, kListenBacklog) != 0) {
      err = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  ::freeaddrinfo(res);
  bridge_->SetListening(listen_fd_);
  if (listen_fd_ < 0) {
    return Unavailable("cannot listen on " + where + ": " + err, {{"field", "listen"}});
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return port_;
}

void Server::Start() {
  MutexLock life(lifecycle_mu_);  // a Stop that came first (an early signal) wins
  if (stopping_ || started_.exchange(true) || listen_fd_ < 0) return;
  pool_ = std::make_unique<httplib::ThreadPool>(static_cast<size_t>(std::max(1, options_.threads)));
  if (!options_.reserved_prefix.empty()) {
    reserved_pool_ = std::make_unique<httplib::ThreadPool>(
        static_cast<size_t>(std::max(1, options_.reserved_threads)));
  }
  GateOptions g;
  g.header_timeout_ms = options_.header_timeout_s * 1000;
  g.idle_timeout_ms = options_.keep_alive_timeout_s * 1000;
  g.max_header_bytes = options_.max_header_bytes;
  g.max_waiting_per_peer = options_.max_waiting_per_peer;
  g.max_waiting = options_.max_waiting;
  // A request without its credential is answered by the gate: no thread for it.
  g.screen = [this](Conn& c, std::string_view head) { return Screen(c, head); };
  gate_ = std::make_unique<Gate>(listen_fd_, tls_.get(), g,
                                 [this](std::shared_ptr<Conn> c) { Dispatch(std::move(c)); });
  Status st = gate_->Start();
  if (!st.ok()) std::fprintf(stderr, "error: %s\n", st.message().c_str());
}

void Server::Run() {
  Start();
  MutexLock l(mu_);
  while (!stopping_) stopped_cv_.Wait(mu_);
}

void Server::Stop() {
  MutexLock life(lifecycle_mu_);
  {
    MutexLock l(mu_);
    if (stopping_.exchange(true)) return;
  }
  stopped_cv_.NotifyAll();
  bridge_->SetListening(-1);  // streams (SSE) end
  if (gate_) gate_->Stop();  // no new requests
  {
    // Requests in progress get a moment to answer (the service has woken its
    // waiters by now); then a handler still blocked reading or writing fails.
    MutexLock l(mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStopGraceMs);
    while (!active_.empty() && stopped_cv_.WaitUntil(mu_, deadline)) {
    }
    for (Conn* c : active_) ::shutdown(c->fd, SHUT_RDWR);
  }
  if (pool_) pool_->shutdown();
  if (reserved_pool_) reserved_pool_->shutdown();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

ServerStats Server::stats() const {
  ServerStats out;
  if (!gate_) return out;
  const GateStats& g = gate_->stats();
  out.waiting = g.waiting;
  out.header_timeouts = g.header_timeouts;
  out.evicted = g.evicted;
  out.header_too_large = g.header_too_large;
  out.tls_failures = g.tls_failures;
  out.unauthenticated_at_gate = g.screened;
  return out;
}

void Server::Admit(Conn& c, std::string_view head) const {
  c.admission = tessera::http::Admit(*router_, policy_, head);
}

void Server::Dispatch(std::shared_ptr<Conn> c) {
  const bool reserved = reserved_pool_ && c->admission && c->admission->reserved;
  httplib::ThreadPool* pool = reserved ? reserved_pool_.get() : pool_.get();
  pool->enqueue([this, c = std::move(c)]() mutable { Serve(std::move(c)); });
}

void Server::Serve(std::shared_ptr<Conn> c) {
  {
    MutexLock l(mu_);
    if (stopping_) return;
    active_.insert(c.get());
  }
  bool keep = false;
  for (;;) {
    ++c->requests;
    const bool last = c->requests >= kMaxRequestsPerConnection;
    std::optional<Admission> admission = std::exchange(c->admission, std::nullopt);
    const Served served = bridge_->ServeOne(
        *c, MonoMs() + int64_t{options_.body_timeout_s} * 1000, last,
        [&](BodyReader& body) { return Respond(admission ? &*admission : nullptr, body); });
    keep = served.keep_alive && !stopping_;
    if (served.body_unread && c->ssl == nullptr) LingerAndDrop(c->fd);
    if (!keep) break;
    // A pipelined request already here is served on this thread, admitted here once.
    const std::string_view head = c->PendingHead();
    if (head.empty()) break;
    Admit(*c, head);
  }
  {
    MutexLock l(mu_);
    active_.erase(c.get());
  }
  stopped_cv_.NotifyAll();
  if (keep && gate_) gate_->Return(std::move(c));
}

Status Server::Unauthorized() const {
  return Status(Code::kUnauthenticated,
                "missing or wrong bearer token (Authorization: Bearer <token>)" +
                    (options_.token_hint.empty() ? "" : "; " + options_.token_hint),
                {{"field", "authorization"}});
}

std::optional<std::string> Server::Screen(Conn& c, std::string_view head) const {
  Admit(c, head);
  if (!c.admission || c.admission->route == nullptr || c.admission->authorized) {
    return std::nullopt;
  }
  const std::string body = ErrorBody(Unauthorized()).dump();
  if (options_.on_request) {
    options_.on_request(c.admission->request, c.admission->route->pattern, 401, 0.0);
  }
  return "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

// Whatever the header alone decides is answered before any byte of the body is read,
// and the connection is then closed: an unknown route, a missing or wrong credential, a
// declared body over the route's limit. A stranger so holds no thread while it trickles
// a body, and no memory for one.
Answer Server::Respond(Admission* admission, BodyReader& body) const {
  const auto t0 = std::chrono::steady_clock::now();
  const Route* route = admission != nullptr ? admission->route : nullptr;
  Request req = admission != nullptr ? std::move(admission->request) : Request{};
  Answer answer;
  if (admission == nullptr) {
    // httplib took a header that ours did not (an absolute-form target, say).
    answer.response =
        Response::Error(InvalidArgument("malformed request header", {{"field", "header"}}));
    answer.close = true;
    answer.body_unread = body.pending();
  } else if (route == nullptr) {
    answer.response = NoRoute(req, admission->method_mismatch);
    answer.body_unread = body.pending();
  } else if (!admission->authorized) {
    answer.response = Response::Error(Unauthorized());
    answer.body_unread = body.pending();
  } else if (Status st = ReadBody(*route, body, &req); !st.ok()) {
    answer.response = Response::Error(st);
    answer.body_unread = true;  // the rest of it
  } else {
    answer.response = route->handler(req);
  }
  if (options_.on_request) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    options_.on_request(req, route != nullptr ? route->pattern : "", answer.response.status, ms);
  }
  return answer;
}

Status Server::ReadBody(const Route& route, BodyReader& body, Request* req) const {
  if (!body.pending()) {
    (void)body.Read(options_.max_body_bytes, &req->body);  // httplib read it, within that
    return Status::Ok();
  }
  const uint64_t limit =
      std::min<uint64_t>(options_.max_body_bytes,
                         route.body_limit ? route.body_limit(*req) : options_.max_json_body_bytes);
  auto too_large = [&] {
    return Status(Code::kPayloadTooLarge,
                  "request body too large: " + route.method + " " + route.pattern +
                      " takes at most " + std::to_string(limit) + " bytes",
                  {{"field", "body"}, {"limit", limit}});
  };
  if (req->Header("content-type").starts_with("multipart/form-data")) {
    // Nothing here takes forms, and httplib's form parser is not ours to feed.
    return InvalidArgument(
        "multipart/form-data bodies are not accepted; send the bytes as the body "
        "(curl --data-binary @FILE)",
        {{"field", "content-type"}});
  }
  if (req->headers.count("content-length") != 0) {
    const std::string declared = req->Header("content-length");
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(declared.c_str(), &end, 10);
    if (errno != 0 || end == declared.c_str() || *end != '\0' || n > limit) return too_large();
  }
  switch (body.Read(limit, &req->body)) {
    case BodyReader::Outcome::kRead:
      return Status::Ok();
    case BodyReader::Outcome::kTooLarge:
      return too_large();
    case BodyReader::Outcome::kFailed:
      break;
  }
  return InvalidArgument("could not read the request body (cut short, or a bad chunked encoding)",
                         {{"field", "body"}});
}

}  // namespace tessera::http
