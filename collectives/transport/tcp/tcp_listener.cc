#include "collectives/transport/tcp/tcp_listener.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "collectives/transport/tcp/handshake_table.h"
#include "collectives/transport/tcp/tcp_handshake.h"
#include "collectives/transport/tcp/tcp_socket.h"

namespace tessera::collectives {
namespace {

using tcp::Fd;
using tcp::ErrnoText;
using tcp::Resolve;
using tcp::SetNoDelay;
using tcp::RemoteName;
using tcp::StillWaiting;
using tcp::ServerHandshake;
using tcp::HandshakeTable;
using tcp::HandshakeLimits;
using tcp::NoteRefusal;
using tcp::FlushRefusalLog;

}  // namespace

TcpListener::TcpListener(int fd, std::string address, int port)
    : fd_(fd), address_(std::move(address)), port_(port) {}

TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<TcpListener>> TcpListener::Bind(const std::string& host, int port) {
  ASSIGN_OR_RETURN(addrinfo * info, Resolve(host, std::to_string(port), true));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> info_owner(info, ::freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* ai = info; ai != nullptr; ai = ai->ai_next) {
    // Non-blocking: a connection that is gone by the time poll said it is there
    // must not block accept until the next one.
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                   ai->ai_protocol));
    if (fd.get() < 0) {
      last_error = "socket: " + ErrnoText(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) < 0 || ::listen(fd.get(), SOMAXCONN) < 0) {
      last_error = ErrnoText(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    int bound_port =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    return std::unique_ptr<TcpListener>(
        new TcpListener(fd.Release(), shown + ":" + std::to_string(bound_port), bound_port));
  }
  return Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " + last_error);
}

Result<std::unique_ptr<TcpAcceptor>> TcpAcceptor::Start(std::unique_ptr<TcpListener> listener,
                                                        const DataPortKey& key) {
  if (listener == nullptr) return InvalidArgument("TcpAcceptor::Start needs a listener");
  int stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) return Unavailable("eventfd: " + ErrnoText(errno));
  return std::unique_ptr<TcpAcceptor>(new TcpAcceptor(std::move(listener), key, stop_fd));
}

TcpAcceptor::TcpAcceptor(std::unique_ptr<TcpListener> listener, const DataPortKey& key,
                         int stop_fd)
    : listener_(std::move(listener)), key_(key), stop_fd_(stop_fd) {
  thread_ = std::thread([this] { AcceptLoop(); });
}

TcpAcceptor::~TcpAcceptor() {
  uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof(one));
  thread_.join();
  ::close(stop_fd_);
}

void TcpAcceptor::AcceptLoop() {
  const std::string port = "data port " + listener_->address();
  // Connections in the middle of their handshake; touched by this thread only.
  HandshakeTable handshakes(HandshakeLimits{kMaxHandshakesPerSource, kMaxHandshakes,
                                            kHelloTimeout, kHelloTimeoutUnderLoad});
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{listener_->fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}});
    Deadline wake = Clock::now() + std::chrono::seconds(1);
    for (size_t i = 0; i < handshakes.size(); ++i) {
      const ServerHandshake& h = handshakes.at(i);
      fds.push_back({h.fd(), h.events(), 0});
      wake = std::min(wake, h.deadline());
    }
    int rc = ::poll(fds.data(), fds.size(), PollTimeoutMs(wake));
    if (rc < 0 && errno != EINTR) return;
    if (rc > 0 && fds[1].revents != 0) return;
    const auto now = Clock::now();
    {
      // Connections nobody took (their group never formed here) expire.
      MutexLock lock(mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        it = now - it->second->arrived > kPendingLifetime ? pending_.erase(it) : std::next(it);
      }
    }
    FlushRefusalLog(port);
    // Handshakes go on as their sockets allow; the late and the failed are refused,
    // the proven wait for their group.
    for (size_t i = 0; i < handshakes.size(); ++i) {
      ServerHandshake& h = handshakes.at(i);
      Result<bool> done = rc > 0 && fds[i + 2].revents != 0 ? h.Step() : Result<bool>(false);
      if (done.ok() && !*done && now >= h.deadline()) done = h.TimedOut();
      if (!done.ok()) {
        NoteRefusal(&refused_, port, h, done.status());
        handshakes.Take(i);
      } else if (*done) {
        auto pending = std::make_unique<Pending>();
        pending->hello = h.hello();
        pending->fd = handshakes.Take(i)->TakeFd();
        pending->arrived = now;
        MutexLock lock(mu_);
        pending_.emplace(pending->hello.group_id, std::move(pending));
        cv_.NotifyAll();
      }
    }
    handshakes.Compact();
    handshaking_ = handshakes.size();
    if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    // A batch of newcomers; each hello is read with the next poll. Over a cap,
    // connections already here make room (HandshakeTable).
    for (size_t n = 0; n < kAcceptBatch; ++n) {
      sockaddr_storage addr{};
      socklen_t addr_len = sizeof(addr);
      Fd fd(::accept4(listener_->fd_, reinterpret_cast<sockaddr*>(&addr), &addr_len,
                      SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd.get() < 0) break;
      SetNoDelay(fd.get());
      const Deadline arrived = Clock::now();
      for (auto& d : handshakes.Admit(std::make_unique<ServerHandshake>(
               std::move(fd), RemoteName(addr, addr_len), key_, handshakes.NewDeadline(arrived)))) {
        NoteRefusal(&refused_, port, *d.handshake, d.why);
      }
    }
    handshakes.Compact();
    handshakes.TightenUnderLoad();
    handshaking_ = handshakes.size();
  }
}

std::unique_ptr<TcpAcceptor::Pending> TcpAcceptor::Take(const std::string& group_id,
                                                          Deadline deadline) {
  MutexLock lock(mu_);
  while (true) {
    for (auto it = pending_.find(group_id); it != pending_.end() && it->first == group_id;) {
      std::unique_ptr<Pending> p = std::move(it->second);
      it = pending_.erase(it);
      // A peer that gave up (an earlier attempt to form the group) has closed.
      if (!StillWaiting(p->fd.get())) continue;
      return p;
    }
    if (!cv_.WaitUntil(mu_, deadline)) {
      auto it = pending_.find(group_id);
      if (it == pending_.end()) return nullptr;
    }
  }
}
}  // namespace tessera::collectives
