#include "http/connection.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tessera::http {

namespace {

constexpr size_t kReadChunk = 16 << 10;

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

bool Conn::WaitFor(short events, int ms) const {
  if (ms < 0) return false;
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

std::string_view Conn::PendingHead() {
  // Lines end in CRLF: the parser skips bare-LF lines, so a header that only has
  // those would never end, and would wait in the gate (then 408), not on a thread.
  while (buf.compare(pos, 2, "\r\n") == 0) pos += 2;
  const std::string_view rest(buf.data() + pos, buf.size() - pos);
  const size_t end = rest.find("\r\n\r\n");
  return end == std::string_view::npos ? std::string_view() : rest.substr(0, end + 4);
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
    if (n > 0 && w == 0 && !WaitFor(wait, timeout_ms)) {
      return false;
    }
  }
  return true;
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
