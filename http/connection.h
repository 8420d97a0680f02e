// One accepted HTTP connection (plain or TLS). Bytes that arrived before a handler
// took the connection (the header the gate waited for, a pipelined request) are
// kept in `buf` and read first (httplib_bridge.h), and what the server decided
// from the header waiting there travels with it (`admission`).
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "http/admission.h"

typedef struct ssl_st SSL;

namespace tessera::http {

struct Conn {
  Conn(int fd, SSL* ssl, std::string peer_ip, int peer_port);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Reads what is available without blocking into `buf`, stopping once `limit`
  // bytes are buffered. Returns false when the peer closed or the connection
  // failed. `*tls_wait_write`: TLS needs the socket writable to read on.
  bool ReadAvailable(bool* tls_wait_write, size_t limit = SIZE_MAX);
  // Completes a TLS handshake as far as possible without blocking: 1 done,
  // 0 wants more I/O (`*wait_write` says which), -1 failed.
  int Handshake(bool* wait_write);
  // The whole request header buffered (through its blank line), or "" while it is
  // not all here. Blank lines before it are dropped (RFC 9112 2.2). A scan for the
  // blank line, not a parse: the header is parsed once, by Admit.
  std::string_view PendingHead();
  // Bytes not yet consumed.
  size_t Buffered() const { return buf.size() - pos; }
  // Waits for `events` (poll(2)) for at most `ms` (negative: not at all); true when ready.
  bool WaitFor(short events, int ms) const;
  // Writes all of `data`; false on failure or when no byte moves for `timeout_ms`.
  bool WriteAll(const char* data, size_t n, int timeout_ms);

  const int fd;
  SSL* const ssl;  // owned; null for plain HTTP
  const std::string peer_ip;
  const int peer_port;
  bool handshaken;
  std::string buf;
  size_t pos = 0;
  int requests = 0;   // served on this connection
  uint64_t seq = 0;   // order of arrival at the gate
  int64_t deadline_ms = 0;
  bool idle = true;   // waiting for the first byte of its next request
  // The server's decision on the header at `pos`: set when PendingHead() is whole,
  // taken by the handler thread that serves it. nullopt: the header did not parse.
  std::optional<Admission> admission;
};

// The address and port in `ss` (IPv4 or IPv6); "" and 0 for another family.
std::pair<std::string, int> AddressOf(const sockaddr_storage& ss);

}  // namespace tessera::http
