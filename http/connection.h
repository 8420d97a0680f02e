// One accepted HTTP connection (plain or TLS) and the httplib::Stream that a
// handler thread reads a request from and writes its response to. Bytes that
// arrived before a handler took the connection (the header the gate waited
// for, a pipelined request) are kept in `buf` and read first.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <cstddef>
#include <string>
#include <utility>

#include <sys/socket.h>

#include "api/clock.h"

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
  // True when `buf` holds a whole request header (through the blank line).
  bool HeaderComplete() const;
  // Bytes not yet consumed.
  size_t Buffered() const { return buf.size() - pos; }
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
};

// The request side of a connection for httplib's parser: reads from `buf` first,
// then the socket, and fails once `deadline_ms` (steady clock) has passed.
class ConnStream : public httplib::Stream {
 public:
  ConnStream(Conn& c, int read_timeout_ms, int write_timeout_ms, int64_t deadline_ms)
      : c_(c), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms),
        deadline_ms_(deadline_ms) {}
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return c_.fd; }

 private:
  // Waits for `events` on the socket within the read timeout and the deadline.
  bool Wait(short events) const;
  Conn& c_;
  int read_timeout_ms_;
  int write_timeout_ms_;
  int64_t deadline_ms_;
};

// The address and port in `ss` (IPv4 or IPv6); "" and 0 for another family.
std::pair<std::string, int> AddressOf(const sockaddr_storage& ss);

}  // namespace tessera::http
