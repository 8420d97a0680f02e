// Socket utilities of the TCP transport, internal to collectives/transport/tcp/: descriptors
// that close themselves, addresses, and whole reads and writes under a deadline.
#pragma once

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "api/status.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives::tcp {

std::string ErrnoText(int err);

// The error of a connection that broke: a reset usually means the peer died.
std::string BrokenText(int err);

// Closes the descriptor unless released; keeps error paths leak-free.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// "host:port" or "[v6]:port" → (host, port). A "name@" prefix (who listens
// there, for messages) is skipped.
Result<std::pair<std::string, std::string>> SplitAddress(const std::string& named_address);

Result<addrinfo*> Resolve(const std::string& host, const std::string& port, bool passive);

void SetNoDelay(int fd);

// Waits for `events` on `fd`; false at the deadline.
bool WaitFor(int fd, short events, Deadline deadline);

// Blocking-with-deadline I/O on a non-blocking socket, for the handshake only.
Status WriteFull(int fd, const void* data, size_t n, Deadline deadline, const std::string& what);

Status ReadFull(int fd, void* data, size_t n, Deadline deadline, const std::string& what);

std::string RemoteName(const sockaddr_storage& addr, socklen_t len);

// A stranger's group id, fit for one line of a log: printable ASCII, the rest
// escaped, cut short.
std::string Printable(const std::string& s);

// True while the peer has neither closed nor sent anything past its proof.
bool StillWaiting(int fd);

}  // namespace tessera::collectives::tcp
