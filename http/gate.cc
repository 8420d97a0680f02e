#include "http/gate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "api/clock.h"
#include "api/status.h"

namespace tessera::http {

namespace {

constexpr int kScanIntervalMs = 100;
// An answered connection is drained for at most this long, reading at most this
// much at each wake-up so that other connections are not kept waiting.
constexpr int64_t kDrainMs = 1000;
constexpr size_t kDrainBytesPerWake = size_t{1} << 20;
constexpr int kAcceptPauseMs = 100;  // after running out of file descriptors

}  // namespace

Gate::Gate(int listen_fd, SSL_CTX* tls, GateOptions options, Dispatch dispatch)
    : listen_fd_(listen_fd), tls_(tls), options_(options), dispatch_(std::move(dispatch)) {}

Gate::~Gate() { Stop(); }

Status Gate::Start() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return Internal(std::string("cannot create the connection gate: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void Gate::Stop() {
  {
    // Under the lock that Return writes the wake-up under: no write can reach
    // the descriptor after it is closed below.
    MutexLock l(returned_mu_);
    if (stopping_.exchange(true)) return;
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
    }
  }
  if (thread_.joinable()) thread_.join();
  waiting_.clear();
  order_.clear();
  by_peer_.clear();
  draining_.clear();
  MutexLock l(returned_mu_);
  returned_.clear();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

void Gate::Return(std::shared_ptr<Conn> c) {
  MutexLock l(returned_mu_);
  if (stopping_ || wake_fd_ < 0) return;  // the connection closes here
  returned_.push_back(std::move(c));
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void Gate::Loop() {
  std::vector<epoll_event> events(256);
  int64_t next_scan = MonoMs() + kScanIntervalMs;
  while (!stopping_) {
    int64_t now = MonoMs();
    int timeout = static_cast<int>(std::max<int64_t>(0, next_scan - now));
    int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) break;
    now = MonoMs();
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        AcceptAll(now);
      } else if (fd == wake_fd_) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof(v));
        std::vector<std::shared_ptr<Conn>> back;
        {
          MutexLock l(returned_mu_);
          back.swap(returned_);
        }
        for (auto& c : back) {
          // Part of its next request may have come with the last one.
          c->idle = c->Buffered() == 0;
          c->deadline_ms = now + (c->idle ? options_.idle_timeout_ms : options_.header_timeout_ms);
          Adopt(std::move(c), now);
        }
      } else if (draining_.count(fd) != 0) {
        Drain(fd, now);
      } else {
        Advance(fd, now);
      }
    }
    if (now >= next_scan) {
      ExpireAll(now);
      if (accept_paused_until_ != 0 && now >= accept_paused_until_) {
        accept_paused_until_ = 0;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = listen_fd_;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      }
      next_scan = now + kScanIntervalMs;
    }
  }
}

void Gate::PauseAccept(int64_t now) {
  accept_paused_until_ = now + kAcceptPauseMs;
  epoll_event ev{};
  ev.events = 0;
  ev.data.fd = listen_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
}

void Gate::AcceptAll(int64_t now) {
  for (int i = 0; i < 256; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the longest-waiting connection makes room, and
        // accepting pauses briefly rather than spinning on a full table.
        if (!order_.empty()) {
          stats_.evicted++;
          Drop(order_.begin()->second);
        }
        PauseAccept(now);
      }
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto [ip, port] = AddressOf(ss);
    SSL* ssl = nullptr;
    if (tls_ != nullptr) {
      ssl = SSL_new(tls_);
      if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
        if (ssl != nullptr) SSL_free(ssl);
        ::close(fd);
        stats_.tls_failures++;
        continue;
      }
      SSL_set_accept_state(ssl);
    }
    auto c = std::make_shared<Conn>(fd, ssl, std::move(ip), port);
    c->idle = false;  // a new connection owes its header from now on
    c->deadline_ms = now + options_.header_timeout_ms;
    stats_.accepted++;
    Adopt(std::move(c), now);
  }
}

void Gate::Adopt(std::shared_ptr<Conn> c, int64_t now) {
  if (stopping_) return;
  const int fd = c->fd;
  const std::string peer = c->peer_ip;
  c->seq = next_seq_++;
  order_.emplace(c->seq, fd);
  by_peer_[peer].emplace(c->seq, fd);
  Conn& ref = *c;
  waiting_.emplace(fd, std::move(c));
  stats_.waiting = waiting_.size();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  EnforceCaps(peer);
  // A returned connection may already hold its next request (pipelined, or
  // decrypted by TLS ahead of time): no readiness event would announce it.
  if (waiting_.count(fd) != 0 &&
      (!ref.PendingHead().empty() || (ref.ssl != nullptr && SSL_pending(ref.ssl) > 0))) {
    Advance(fd, now);
  }
}

void Gate::EnforceCaps(const std::string& peer) {
  auto it = by_peer_.find(peer);
  while (it != by_peer_.end() && it->second.size() > options_.max_waiting_per_peer) {
    stats_.evicted++;
    Drop(it->second.begin()->second);
    it = by_peer_.find(peer);
  }
  while (order_.size() > options_.max_waiting) {
    stats_.evicted++;
    Drop(order_.begin()->second);
  }
}

void Gate::Watch(Conn& c, bool want_write) {
  epoll_event ev{};
  ev.events = want_write ? EPOLLOUT : EPOLLIN;
  ev.data.fd = c.fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
}

void Gate::Advance(int fd, int64_t now) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  Conn& c = *it->second;
  bool want_write = false;
  if (!c.handshaken) {
    int r = c.Handshake(&want_write);
    if (r < 0) {
      stats_.tls_failures++;
      return Drop(fd);
    }
    if (r == 0) return Watch(c, want_write);
  }
  const size_t before = c.Buffered();
  const bool open = c.ReadAvailable(&want_write, options_.max_header_bytes + 1);
  if (c.idle && c.Buffered() > before) {
    // The first bytes of a request: from now on its header has a deadline.
    c.idle = false;
    c.deadline_ms = now + options_.header_timeout_ms;
  }
  if (const std::string_view head = c.PendingHead(); !head.empty()) {
    if (options_.screen) {
      if (std::optional<std::string> answer = options_.screen(c, head)) {
        stats_.screened++;
        return Answer(fd, *answer, now);
      }
    }
    std::shared_ptr<Conn> mine = std::move(it->second);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    waiting_.erase(it);
    order_.erase(mine->seq);
    auto p = by_peer_.find(mine->peer_ip);
    if (p != by_peer_.end()) {
      p->second.erase(mine->seq);
      if (p->second.empty()) by_peer_.erase(p);
    }
    stats_.waiting = waiting_.size();
    dispatch_(std::move(mine));
    return;
  }
  if (c.Buffered() > options_.max_header_bytes) {
    stats_.header_too_large++;
    return Refuse(fd, 431, "request header too large");
  }
  if (!open) return Drop(fd);
  Watch(c, want_write);
}

void Gate::Drop(int fd) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  const uint64_t seq = it->second->seq;
  auto p = by_peer_.find(it->second->peer_ip);
  if (p != by_peer_.end()) {
    p->second.erase(seq);
    if (p->second.empty()) by_peer_.erase(p);
  }
  order_.erase(seq);
  waiting_.erase(it);  // closes it, unless a handler still holds it
  stats_.waiting = waiting_.size();
}

void Gate::Refuse(int fd, int status, const char* reason) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  const Status st = status == 408
                        ? Status(Code::kDeadlineExceeded,
                                 std::string(reason) + " (within " +
                                     std::to_string(options_.header_timeout_ms) + " ms)",
                                 {{"field", "header"}})
                        : Status(Code::kInvalidArgument,
                                 std::string(reason) + " (more than " +
                                     std::to_string(options_.max_header_bytes) + " bytes)",
                                 {{"field", "header"}, {"limit", options_.max_header_bytes}});
  const std::string body = ErrorBody(st).dump();
  const std::string text = std::string("HTTP/1.1 ") + std::to_string(status) + " " +
                           (status == 408 ? "Request Timeout" : "Request Header Fields Too Large") +
                           "\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  if (it->second->handshaken) (void)it->second->WriteAll(text.data(), text.size(), 0);
  Drop(fd);
}

void Gate::Answer(int fd, const std::string& response, int64_t now) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  std::shared_ptr<Conn> c = it->second;
  const bool sent = c->WriteAll(response.data(), response.size(), 0);
  Drop(fd);  // out of the waiting room (and its caps)
  // TLS would need its own shutdown; a full drain room means a flood: close now.
  if (!sent || c->ssl != nullptr || draining_.size() >= options_.max_waiting) return;
  ::shutdown(fd, SHUT_WR);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return;
  draining_.emplace(fd, std::make_pair(std::move(c), now + kDrainMs));
  Drain(fd, now);
}

void Gate::Drain(int fd, int64_t now) {
  auto it = draining_.find(fd);
  if (it == draining_.end()) return;
  char scratch[16 << 10];
  for (size_t dropped = 0; dropped < kDrainBytesPerWake;) {
    const ssize_t n = ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT);
    if (n > 0) {
      dropped += static_cast<size_t>(n);
      continue;
    }
    const bool later = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    if (later && now < it->second.second) return;  // the peer may still send: wait for it
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);  // closed by the peer, failed, or late
    draining_.erase(it);
    return;
  }
  // A fast sender: the rest at its next readiness, until the deadline (ExpireAll).
}

void Gate::ExpireAll(int64_t now) {
  std::vector<int> drained;
  for (const auto& [fd, entry] : draining_) {
    if (now >= entry.second) drained.push_back(fd);
  }
  for (int fd : drained) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    draining_.erase(fd);
  }
  std::vector<std::pair<int, bool>> expired;  // fd, owed a header
  for (const auto& [fd, c] : waiting_) {
    if (now >= c->deadline_ms) expired.emplace_back(fd, !c->idle);
  }
  for (const auto& [fd, owed] : expired) {
    if (owed) {
      stats_.header_timeouts++;
      Refuse(fd, 408, "request header not received in time");
    } else {
      Drop(fd);  // an idle kept-alive connection: closed quietly
    }
  }
}

}  // namespace tessera::http
