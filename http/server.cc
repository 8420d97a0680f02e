#include "http/server.h"

#include "http/request_head.h"

#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <openssl/ssl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "http/bearer_token.h"
#include "http/connection.h"
#include "http/gate.h"
#include "http/request_head.h"
#include "http/tls.h"

namespace tessera::http {

// httplib's request parser and dispatcher, fed one connection at a time by Serve.
class Server::Core : public httplib::Server {
 public:
  bool ServeOne(httplib::Stream& strm, bool close, bool& closed) {
    return process_request(strm, close, closed, nullptr);
  }
  // httplib ends streamed responses once its listening socket is invalid: the
  // socket is ours, so it is told which one is listening, and when it closes.
  void SetListening(int fd) { svr_sock_ = fd; }
};

namespace {

// Set by a handler whose response closes the connection (Connection: close):
// whatever the client sent after is not read, so the connection cannot be reused.
thread_local bool t_close_after = false;

void MarkClose(httplib::Response& res) {
  res.set_header("Connection", "close");
  t_close_after = true;
}

// Set when a request was answered without its body being read.
thread_local bool t_body_unread = false;

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

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

// The request as routes see it, without its body.
Request ToRequest(const httplib::Request& hreq) {
  Request req;
  req.method = hreq.method;
  // Route on the raw target so a %2F inside a name stays inside that name.
  const std::string& target = hreq.target.empty() ? hreq.path : hreq.target;
  req.path = target.substr(0, target.find('?'));
  for (const auto& [k, v] : hreq.params) req.query.emplace(k, v);
  for (const auto& [k, v] : hreq.headers) {
    std::string lower = k;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers[lower] = v;
  }
  return req;
}

}  // namespace

namespace {

// A handler's exception: logged, and answered 500 with the JSON error body.
void OnException(const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::fprintf(stderr, "error: %s %s: %s\n", req.method.c_str(), req.path.c_str(), what.c_str());
  Response r = Response::Error(Internal("internal error: " + what));
  res.status = r.status;
  res.set_content(r.body, "application/json");
}

// httplib's own rejections (oversized body, bad request line) get the JSON body too.
void OnHttplibError(const httplib::Request& req, httplib::Response& res) {
  // After a refused request line or body, the rest of what the client sent is unread.
  if (res.status == 400 || res.status == 413 || res.status == 414) MarkClose(res);
  if (!res.body.empty()) return;
  if (res.status == 400 && (req.method == "POST" || req.method == "PUT") &&
      !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
    res.set_content(ErrorBody(InvalidArgument(req.method + " needs a body with a Content-Length; "
                                              "send an empty JSON object (curl -d '{}')",
                                              {{"field", "body"}}))
                        .dump(),
                    "application/json");
    return;
  }
  Code code = res.status == 413   ? Code::kPayloadTooLarge
              : res.status == 404 ? Code::kNotFound
              : res.status < 500  ? Code::kInvalidArgument
                                  : Code::kInternal;
  std::string msg = res.status == 413 ? "request body too large" : "bad request";
  res.set_content(ErrorBody(Status(code, msg)).dump(), "application/json");
}

}  // namespace

Server::Server(std::shared_ptr<Router> router, ServerOptions options)
    : router_(std::move(router)), options_(std::move(options)), core_(std::make_unique<Core>()),
      tls_(nullptr, SSL_CTX_free) {
  auto& s = *core_;
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_keep_alive_max_count(kMaxRequestsPerConnection);
  s.set_keep_alive_timeout(options_.keep_alive_timeout_s);
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(&req, &res); };
  // Bodies are read here, whatever their Content-Type (HandleWithBody).
  auto with_body = [this](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
    HandleWithBody(&req, &res, &reader);
  };
  s.Get(".*", handler);
  s.Post(".*", with_body);
  s.Put(".*", with_body);
  s.Patch(".*", with_body);
  s.Delete(".*", handler);
  s.set_exception_handler(OnException);
  s.set_error_handler(OnHttplibError);
}

// Bodies are read here, whatever their Content-Type: left to httplib, a body that says
// it is a form (curl --data-binary's default) is capped at 8 KiB, and tensor bytes are
// not forms. The size limit still applies (413). Whatever the header alone decides is
// answered before any byte of the body is read, and the connection is then closed: an
// unknown route, a missing or wrong credential, a declared body over the route's limit.
// A stranger so holds no thread while it trickles a body, and no memory for one.
void Server::HandleWithBody(const void* raw_req, void* raw_res, const void* raw_reader) {
  const auto& req = *static_cast<const httplib::Request*>(raw_req);
  auto& res = *static_cast<httplib::Response*>(raw_res);
  const auto& reader = *static_cast<const httplib::ContentReader*>(raw_reader);
  std::string none;
  // An answer without reading (the rest of) the body: the connection then closes.
  auto refuse = [&](const Status& st) {
    Handle(&req, &res, &none, &st);
    MarkClose(res);
    t_body_unread = true;
  };
  Request head = ToRequest(req);
  bool wrong_method = false;
  const Route* route = router_->Match(&head, &wrong_method);
  if (route == nullptr || !Authorized(*route, head)) {
    Handle(&req, &res, &none);  // the 404, 405 or 401
    MarkClose(res);
    t_body_unread = true;
    return;
  }
  const uint64_t limit =
      std::min<uint64_t>(options_.max_body_bytes,
                         route->body_limit ? route->body_limit(head) : options_.max_json_body_bytes);
  auto too_large = [&] {
    return Status(Code::kPayloadTooLarge,
                  "request body too large: " + route->method + " " + route->pattern +
                      " takes at most " + std::to_string(limit) + " bytes",
                  {{"field", "body"}, {"limit", limit}});
  };
  if (req.is_multipart_form_data()) {
    // Nothing here takes forms, and httplib's form parser is not ours to feed.
    return refuse(InvalidArgument(
        "multipart/form-data bodies are not accepted; send the bytes as the body "
        "(curl --data-binary @FILE)",
        {{"field", "content-type"}}));
  }
  if (req.has_header("Content-Length")) {
    const std::string declared = req.get_header_value("Content-Length");
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(declared.c_str(), &end, 10);
    if (errno != 0 || end == declared.c_str() || *end != '\0' || n > limit) {
      return refuse(too_large());
    }
  }
  std::string body;
  bool over = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (body.size() + n > limit) {
      over = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  // httplib refuses a declared Content-Length over max_body_bytes itself (413).
  if (over || res.status == 413) return refuse(too_large());  // the rest is unread
  if (!read) {
    return refuse(InvalidArgument(
        "could not read the request body (cut short, or a bad chunked encoding)",
        {{"field", "body"}}));
  }
  Handle(&req, &res, &body);
}

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
  core_->SetListening(listen_fd_);
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
  g.screen = [this](std::string_view head) { return Screen(head); };
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
  core_->SetListening(-1);   // streams (SSE) end
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

bool Server::Reserved(const Conn& c) const {
  if (options_.reserved_prefix.empty()) return false;
  std::string_view head(c.buf.data() + c.pos, c.buf.size() - c.pos);
  size_t start = head.find_first_not_of("\r\n");
  if (start == std::string_view::npos) return false;
  head.remove_prefix(start);
  size_t eol = head.find('\n');
  std::string_view line = head.substr(0, eol);
  size_t sp = line.find(' ');
  if (sp == std::string_view::npos) return false;
  std::string_view target = line.substr(sp + 1);
  if (target.compare(0, options_.reserved_prefix.size(), options_.reserved_prefix) != 0) return false;
  if (options_.token.empty()) return true;
  // Only requests that carry the token: a stranger cannot take these threads.
  while (eol != std::string_view::npos) {
    head.remove_prefix(eol + 1);
    eol = head.find('\n');
    std::string_view h = head.substr(0, eol);
    if (!h.empty() && h.back() == '\r') h.remove_suffix(1);
    if (h.empty()) break;
    if (StartsWithNoCase(h, "authorization:")) {
      std::string_view v = h.substr(14);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      return BearerMatches(std::string(v), options_.token);
    }
  }
  return false;
}

void Server::Dispatch(std::shared_ptr<Conn> c) {
  httplib::ThreadPool* pool = Reserved(*c) ? reserved_pool_.get() : pool_.get();
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
    ConnStream strm(*c, options_.read_timeout_s * 1000, options_.write_timeout_s * 1000,
                    MonoMs() + int64_t{options_.body_timeout_s} * 1000);
    t_close_after = false;
    t_body_unread = false;
    bool closed = false;
    const bool ok = core_->ServeOne(strm, last, closed);
    keep = ok && !closed && !last && !t_close_after && !stopping_;
    if (t_body_unread && c->ssl == nullptr) LingerAndDrop(c->fd);
    // A pipelined request already here is served on this thread.
    if (!keep || !c->HeaderComplete()) break;
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

std::optional<std::string> Server::Screen(std::string_view head) const {
  std::optional<Request> req = ParseRequestHead(head);
  if (!req) return std::nullopt;  // the handler's parser answers it
  bool wrong_method = false;
  Request matched = *req;
  const Route* route = router_->Match(&matched, &wrong_method);
  if (route == nullptr || Authorized(*route, *req)) return std::nullopt;
  const std::string body = ErrorBody(Unauthorized()).dump();
  if (options_.on_request) options_.on_request(matched, route->pattern, 401, 0.0);
  return "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

bool Server::Authorized(const Route& route, const Request& req) const {
  return !route.auth || options_.token.empty() ||
         BearerMatches(req.Header("authorization"), options_.token) ||
         (route.query_token &&
          BearerMatches("Bearer " + req.Query("token").value_or(""), options_.token));
}

void Server::Handle(const void* raw_req, void* raw_res, std::string* body,
                    const Status* refusal) {
  const auto& hreq = *static_cast<const httplib::Request*>(raw_req);
  auto& hres = *static_cast<httplib::Response*>(raw_res);
  auto t0 = std::chrono::steady_clock::now();
  Request req = ToRequest(hreq);
  req.body = body != nullptr ? std::move(*body) : hreq.body;

  Response res;
  std::string pattern;
  bool wrong_method = false;
  Request matched = req;
  const Route* route = router_->Match(&matched, &wrong_method);
  if (!route) {
    res = router_->Dispatch(req);  // produces the 404 / 405 body
  } else {
    pattern = route->pattern;
    if (!Authorized(*route, req)) {
      res = Response::Error(Unauthorized());
    } else if (refusal != nullptr) {
      res = Response::Error(*refusal);
    } else {
      res = route->handler(matched);
    }
  }
  hres.status = res.status;
  for (const auto& [k, v] : res.headers) hres.set_header(k, v);
  if (hres.get_header_value("Connection") == "close") t_close_after = true;
  if (res.stream) {
    auto stream = res.stream;
    hres.set_chunked_content_provider(
        res.content_type, [stream](size_t, httplib::DataSink& sink) {
          bool more = stream([&sink](std::string_view chunk) {
            return sink.is_writable() && sink.write(chunk.data(), chunk.size());
          });
          if (!more) sink.done();
          return more;
        });
  } else if (!res.content_type.empty()) {
    hres.set_content(res.body, res.content_type);
  } else if (!res.body.empty()) {
    hres.set_content(res.body, "application/octet-stream");
  }
  if (options_.on_request) {
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
    options_.on_request(matched, pattern, res.status, ms);
  }
}

}  // namespace tessera::http
