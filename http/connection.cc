#include "http/connection.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <tuple>

namespace tessera::http {

namespace {

constexpr size_t kReadChunk = 16 << 10;

// Waits for `events` for at most `ms` (negative: not at all). True when ready.
bool PollFor(int fd, short events, int ms) {
  if (ms < 0) return false;
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

}  // namespace

Conn::Conn(int fd_, SSL* ssl_, std::string ip, int port)
    : fd(fd_), ssl(ssl_), peer_ip(std::move(ip)), peer_port(port), handshaken(ssl_ == nullptr) {}

Conn::~Conn() {
  if (ssl != nullptr) {
    if (handshaken) (void)SSL_shutdown(ssl);  // best effort close_notify; never waits
    SSL_free(ssl);
  }
  ::close(fd);
}

int Conn::Handshake(bool* wait_write) {
  *wait_write = false;
  if (handshaken) return 1;
  ERR_clear_error();
  int r = SSL_do_handshake(ssl);
  if (r == 1) {
    handshaken = true;
    return 1;
  }
  int err = SSL_get_error(ssl, r);
  if (err == SSL_ERROR_WANT_READ) return 0;
  if (err == SSL_ERROR_WANT_WRITE) {
    *wait_write = true;
    return 0;
  }
  ERR_clear_error();
  return -1;
}

bool Conn::ReadAvailable(bool* tls_wait_write, size_t limit) {
  *tls_wait_write = false;
  if (pos > 0 && pos == buf.size()) {
    buf.clear();
    pos = 0;
  }
  for (;;) {
    if (buf.size() - pos >= limit) return true;
    size_t old = buf.size();
    buf.resize(old + kReadChunk);
    ssize_t n;
    if (ssl != nullptr) {
      ERR_clear_error();
      int r = SSL_read(ssl, buf.data() + old, static_cast<int>(kReadChunk));
      if (r > 0) {
        n = r;
      } else {
        buf.resize(old);
        int err = SSL_get_error(ssl, r);
        if (err == SSL_ERROR_WANT_READ) return true;
        if (err == SSL_ERROR_WANT_WRITE) {
          *tls_wait_write = true;
          return true;
        }
        ERR_clear_error();
        return false;
      }
    } else {
      n = ::recv(fd, buf.data() + old, kReadChunk, 0);
      if (n <= 0) {
        buf.resize(old);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
        return false;
      }
    }
    buf.resize(old + static_cast<size_t>(n));
    if (static_cast<size_t>(n) < kReadChunk && (ssl == nullptr || SSL_pending(ssl) == 0)) {
      return true;
    }
  }
}

bool Conn::HeaderComplete() const {
  std::string_view rest(buf.data() + pos, buf.size() - pos);
  // Blank lines before a request line are allowed (RFC 9112 2.2); a header ends
  // at the first empty line after some text. Lines end in CRLF: the parser
  // skips bare-LF lines, so a header that only has those would never end, and
  // would wait here (then 408) rather than on a handler thread.
  size_t start = rest.find_first_not_of("\r\n");
  if (start == std::string_view::npos) return false;
  rest.remove_prefix(start);
  return rest.find("\r\n\r\n") != std::string_view::npos;
}

bool Conn::WriteAll(const char* data, size_t n, int timeout_ms) {
  while (n > 0) {
    ssize_t w;
    short wait = POLLOUT;
    if (ssl != nullptr) {
      ERR_clear_error();
      int r = SSL_write(ssl, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
      if (r > 0) {
        w = r;
      } else {
        int err = SSL_get_error(ssl, r);
        if (err == SSL_ERROR_WANT_READ) {
          wait = POLLIN;
        } else if (err != SSL_ERROR_WANT_WRITE) {
          ERR_clear_error();
          return false;
        }
        w = 0;
      }
    } else {
      w = ::send(fd, data, n, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
        w = 0;
      }
    }
    data += w;
    n -= static_cast<size_t>(w);
    if (n > 0 && w == 0 && !PollFor(fd, wait, timeout_ms)) {
      return false;
    }
  }
  return true;
}

bool ConnStream::Wait(short events) const {
  int64_t ms = read_timeout_ms_;
  if (deadline_ms_ > 0) ms = std::min<int64_t>(ms, deadline_ms_ - MonoMs());
  return PollFor(c_.fd, events, static_cast<int>(std::max<int64_t>(ms, -1)));
}

bool ConnStream::is_readable() const {
  if (c_.Buffered() > 0) return true;
  if (c_.ssl != nullptr && SSL_pending(c_.ssl) > 0) return true;
  return Wait(POLLIN);
}

bool ConnStream::is_writable() const {
  // A peer that has closed is not writable, whatever the socket buffer says.
  pollfd p{c_.fd, POLLOUT, 0};
  if (::poll(&p, 1, write_timeout_ms_) <= 0 || (p.revents & (POLLERR | POLLHUP)) != 0) return false;
  return (p.revents & POLLOUT) != 0;
}

ssize_t ConnStream::read(char* ptr, size_t size) {
  for (;;) {
    if (c_.Buffered() > 0) {
      size_t n = std::min(size, c_.Buffered());
      std::memcpy(ptr, c_.buf.data() + c_.pos, n);
      c_.pos += n;
      if (c_.pos == c_.buf.size()) {
        c_.buf.clear();
        c_.pos = 0;
      }
      return static_cast<ssize_t>(n);
    }
    if (deadline_ms_ > 0 && MonoMs() >= deadline_ms_) return -1;
    bool wait_write = false;
    const bool open = c_.ReadAvailable(&wait_write);
    if (c_.Buffered() > 0) continue;
    if (!open) return 0;  // the peer closed
    if (!Wait(wait_write ? POLLOUT : POLLIN)) return -1;
  }
}

ssize_t ConnStream::write(const char* ptr, size_t size) {
  return c_.WriteAll(ptr, size, write_timeout_ms_) ? static_cast<ssize_t>(size) : -1;
}

void ConnStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  ip = c_.peer_ip;
  port = c_.peer_port;
}

void ConnStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ip.clear();
  port = 0;
  if (::getsockname(c_.fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return;
  std::tie(ip, port) = AddressOf(ss);
}

std::pair<std::string, int> AddressOf(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return {host, port};
}

}  // namespace tessera::http
