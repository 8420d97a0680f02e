#include "collectives/transport/tcp/tcp_socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <cerrno>
#include <cstring>

namespace tessera::collectives::tcp {

std::string ErrnoText(int err) { return std::strerror(err); }

std::string BrokenText(int err) {
  return ErrnoText(err) +
         (err == ECONNRESET || err == EPIPE ? " (did the process die?)" : std::string());
}

Result<std::pair<std::string, std::string>> SplitAddress(const std::string& named_address) {
  const std::string address = named_address.substr(named_address.find('@') + 1);
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return InvalidArgument("bad address '" + address + "' (expected host:port)");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, address.substr(colon + 1));
}

Result<addrinfo*> Resolve(const std::string& host, const std::string& port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* info = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &info);
  if (rc != 0) {
    return InvalidArgument("cannot resolve '" + host + ":" + port + "': " + ::gai_strerror(rc));
  }
  return info;
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool WaitFor(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the read/write report the error
  }
}

Status WriteFull(int fd, const void* data, size_t n, Deadline deadline, const std::string& what) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return DeadlineExceeded("timed out " + what);
    } else {
      return Unavailable(what + ": " + ErrnoText(errno));
    }
  }
  return Status::Ok();
}

Status ReadFull(int fd, void* data, size_t n, Deadline deadline, const std::string& what) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return Unavailable(what + ": connection closed by the peer");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!WaitFor(fd, POLLIN, deadline)) return DeadlineExceeded("timed out " + what);
    } else {
      return Unavailable(what + ": " + ErrnoText(errno));
    }
  }
  return Status::Ok();
}

std::string RemoteName(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), port,
                    sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return addr.ss_family == AF_INET6 ? "[" + std::string(host) + "]:" + port
                                    : std::string(host) + ":" + port;
}

std::string Printable(const std::string& s) {
  constexpr size_t kMax = 200;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      char esc[5];
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      out += esc;
    }
  }
  if (s.size() > kMax) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

bool StillWaiting(int fd) {
  uint8_t byte;
  ssize_t r = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace tessera::collectives::tcp
