#include "collectives/transport/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <set>
#include <thread>
#include <utility>

#include "api/status.h"
#include "collectives/transport/tcp/tcp_handshake.h"
#include "collectives/transport/tcp/tcp_peer.h"
#include "collectives/transport/tcp/tcp_socket.h"

namespace tessera::collectives {
namespace {

using tcp::Fd;
using tcp::ErrnoText;
using tcp::BrokenText;
using tcp::ConnectTo;
using tcp::AnswerHello;
using tcp::WaitingTimeout;
using tcp::AcceptOne;
using wire::kFrameHeaderBytes;
using wire::kMaxGroupIdBytes;

constexpr std::chrono::milliseconds kAbortSendTimeout{1000};
// How long Close waits for a sender it woke to let go of a connection.
constexpr std::chrono::milliseconds kGoodbyeLockTimeout{200};

}  // namespace

Result<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    std::unique_ptr<TcpListener> listener, const std::vector<std::string>& addresses,
    const TcpOptions& o) {
  if (listener == nullptr) return InvalidArgument("TcpTransport::Connect needs a listener");
  // Owned by the accepting function: a transport that connects pair by pair keeps it.
  std::shared_ptr<TcpListener> owned(std::move(listener));
  return Join(addresses, o, [owned, o](Deadline deadline, const std::set<int>& waiting) {
    return AcceptOne(owned->fd_, owned->address(), o, deadline, waiting);
  });
}

Result<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    TcpAcceptor& acceptor, const std::vector<std::string>& addresses, const TcpOptions& options) {
  TcpOptions o = options;
  o.key = acceptor.key_;
  return Join(addresses, o,
              [&acceptor, o](Deadline deadline, const std::set<int>& waiting) -> Result<std::pair<int, Fd>> {
                std::unique_ptr<TcpAcceptor::Pending> incoming =
                    acceptor.Take(o.group_id, deadline);
                if (!incoming) return WaitingTimeout(o, waiting);
                ASSIGN_OR_RETURN(int from, AnswerHello(incoming->fd.get(), incoming->hello, o,
                                                       deadline, waiting));
                return std::make_pair(from, std::move(incoming->fd));
              });
}

Result<std::unique_ptr<TcpTransport>> TcpTransport::Join(const std::vector<std::string>& addresses,
                                                         const TcpOptions& o, AcceptFn accept) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is not in a group of size " +
                           std::to_string(o.size));
  }
  if (addresses.size() != static_cast<size_t>(o.size)) {
    return InvalidArgument(std::to_string(addresses.size()) + " addresses for a group of size " +
                           std::to_string(o.size));
  }
  if (o.group_id.size() > kMaxGroupIdBytes) return InvalidArgument("group id too long");
  if (!o.connect_all) {
    // Pair by pair, later (Reach): no connection yet.
    std::vector<std::unique_ptr<Peer>> peers;
    for (int j = 0; j < o.size; ++j) {
      peers.push_back(std::make_unique<Peer>());
      peers.back()->address = addresses[j];
    }
    std::unique_ptr<TcpTransport> t(new TcpTransport(o.rank, o.group_id, o.spin, std::move(peers)));
    t->options_ = o;
    t->addresses_ = addresses;
    t->accept_ = std::move(accept);
    return t;
  }
  const Deadline deadline = Clock::now() + o.connect_timeout;

  std::vector<Fd> fds(o.size);
  for (int j = 0; j < o.rank; ++j) {
    ASSIGN_OR_RETURN(fds[j], ConnectTo(j, addresses[j], o, deadline));
  }
  std::set<int> waiting;
  for (int j = o.rank + 1; j < o.size; ++j) waiting.insert(j);
  while (!waiting.empty()) {
    ASSIGN_OR_RETURN(auto accepted, accept(deadline, waiting));
    if (accepted.first < 0) continue;
    waiting.erase(accepted.first);
    fds[accepted.first] = std::move(accepted.second);
  }

  std::vector<std::unique_ptr<Peer>> peers;
  for (int j = 0; j < o.size; ++j) {
    auto peer = std::make_unique<Peer>();
    peer->fd = fds[j].Release();
    peer->address = addresses[j];
    peers.push_back(std::move(peer));
  }
  return std::unique_ptr<TcpTransport>(
      new TcpTransport(o.rank, o.group_id, o.spin, std::move(peers)));
}


TcpTransport::TcpTransport(int rank, std::string group_id, std::chrono::microseconds spin,
                           std::vector<std::unique_ptr<Peer>> peers)
    : rank_(rank),
      group_id_(std::move(group_id)),
      spin_(spin),
      peers_(std::move(peers)),
      mailbox_(rank, static_cast<int>(peers_.size())) {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  MutexLock lock(rx_mu_);
  const int n = size();
  rx_fds_.resize(n + 1);
  for (int p = 0; p < n; ++p) rx_fds_[p] = {p == rank_ ? -1 : peers_[p]->fd, POLLIN, 0};
  rx_fds_[n] = {stop_fd_, POLLIN, 0};
}

TcpTransport::~TcpTransport() { Close(); }

bool TcpTransport::Reached(int peer) const {
  if (peer < 0 || peer >= size() || peer == rank_) return false;
  Peer& p = *peers_[peer];
  MutexLock lock(p.send_mu);
  return p.fd >= 0 || p.ever_connected;
}

Status TcpTransport::CheckReached(int peer) const {
  if (!sparse() || Reached(peer)) return Status::Ok();
  return Internal("rank " + std::to_string(rank_) + " of group '" + group_id_ +
                                "' has not reached rank " + std::to_string(peer) +
                                " (TcpTransport::Reach, on both sides, comes first)",
                            {{"peer_rank", peer}});
}

void TcpTransport::Install(int peer, int fd) {
  MutexLock rx(rx_mu_);
  Peer& p = *peers_[peer];
  {
    MutexLock lock(p.send_mu);
    p.fd = fd;
    p.ever_connected = true;
  }
  // A transport closed meanwhile reads no more: its Close has passed this peer.
  rx_fds_[peer].fd = closed_.load() ? -1 : fd;
}

Status TcpTransport::Reach(std::span<const int> peers, Deadline deadline) {
  if (!sparse()) return Status::Ok();
  RETURN_IF_ERROR(status());
  std::vector<int> lower;
  std::set<int> higher;
  for (int p : peers) {
    RETURN_IF_ERROR(CheckPeerRank(rank_, size(), p));
    if (Reached(p)) continue;
    if (p < rank_) {
      lower.push_back(p);
    } else {
      higher.insert(p);
    }
  }
  std::sort(lower.begin(), lower.end());
  lower.erase(std::unique(lower.begin(), lower.end()), lower.end());
  TcpOptions o = options_;
  o.connect_timeout = std::chrono::ceil<std::chrono::milliseconds>(
      std::max(deadline - Clock::now(), Clock::duration::zero()));
  // As a join: the lower ranks first (each accepts once it dialed its own lower ones),
  // then the higher ones, in whatever order they come.
  for (int j : lower) {
    ASSIGN_OR_RETURN(Fd fd, ConnectTo(j, addresses_[j], o, deadline));
    Install(j, fd.Release());
  }
  // Any higher rank not reached yet may come: it reaches this one for a later call.
  std::set<int> waiting;
  for (int j = rank_ + 1; j < size(); ++j) {
    if (!Reached(j)) waiting.insert(j);
  }
  while (!higher.empty()) {
    ASSIGN_OR_RETURN(auto accepted, accept_(deadline, waiting));
    if (accepted.first < 0) continue;
    waiting.erase(accepted.first);
    higher.erase(accepted.first);
    Install(accepted.first, accepted.second.Release());
  }
  return Status::Ok();
}

Status TcpTransport::Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  RETURN_IF_ERROR(CheckReached(peer));
  if (Status st = mailbox_.SendStatus(peer); !st.ok()) {
    mailbox_.Poison(st);
    return st;
  }
  Status st = SendFrame(peer, FrameKind::kData, parts, deadline);
  if (!st.ok()) {
    if (st.code() == Code::kUnavailable) mailbox_.MarkPeerGone(peer, st);
    mailbox_.Poison(st);
  }
  return st;
}

Status TcpTransport::SendFrame(int peer_rank, FrameKind kind, std::span<const ConstBytes> parts,
                               Deadline deadline) {
  Peer& peer = *peers_[peer_rank];
  auto who = [&] { return "rank " + std::to_string(peer_rank) + " (" + peer.address + ")"; };
  // Contended only while Close or Abort races a send, so polling is cheap enough.
  while (!peer.send_mu.try_lock()) {
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("timed out waiting to send to " + who(), {{"peer_rank", peer_rank}});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  MutexLock lock(peer.send_mu, std::adopt_lock);
  if (closed_.load() && kind != FrameKind::kGoodbye) {
    return Unavailable("the transport of rank " + std::to_string(rank_) + " is closed");
  }
  if (peer.stream_broken) {
    return Unavailable("the connection to " + who() + " broke earlier", {{"peer_rank", peer_rank}});
  }
  uint64_t length = 0;
  for (ConstBytes part : parts) length += part.size();
  uint8_t header[kFrameHeaderBytes];
  wire::EncodeFrameHeader({kind, length}, header);

  std::vector<iovec> iov;
  iov.reserve(parts.size() + 1);
  iov.push_back({header, kFrameHeaderBytes});
  for (ConstBytes part : parts) {
    if (!part.empty()) iov.push_back({const_cast<uint8_t*>(part.data()), part.size()});
  }
  const uint64_t total = kFrameHeaderBytes + length;
  uint64_t sent = 0;
  size_t first = 0;  // first iovec not fully sent
  while (sent < total) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = iov.size() - first;
    ssize_t n = ::sendmsg(peer.fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<uint64_t>(n);
      size_t left = static_cast<size_t>(n);
      while (left > 0 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (left > 0) {
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const SendWait waited = WaitToSend(peer_rank, deadline);
      if (waited != SendWait::kReady) {
        if (sent > 0) peer.stream_broken = true;
        if (waited == SendWait::kTimeout) {
          return DeadlineExceeded("timed out sending " + std::to_string(total) + " bytes to " +
                                      who() + ": it is not reading",
                                  {{"peer_rank", peer_rank}});
        }
        return Unavailable("the transport of rank " + std::to_string(rank_) + " is closed");
      }
      continue;
    }
    peer.stream_broken = true;
    return Unavailable("connection to " + who() + " lost while sending: " + BrokenText(errno),
                       {{"peer_rank", peer_rank}});
  }
  return Status::Ok();
}

TcpTransport::SendWait TcpTransport::WaitToSend(int peer_rank, Deadline deadline) {
  if (rx_mu_.try_lock()) {
    // The peer may itself be blocked sending to this rank: receive meanwhile.
    MutexLock rx(rx_mu_, std::adopt_lock);
    if (closed_.load()) return SendWait::kStopped;
    pollfd& mine = rx_fds_[peer_rank];
    if (mine.fd < 0) return SendWait::kReady;  // its end is finished: send fails, naming it
    mine.events = POLLIN | POLLOUT;
    SendWait result = SendWait::kTimeout;
    while (true) {
      if (Pump(PollTimeoutMs(deadline))) {
        result = SendWait::kStopped;
        break;
      }
      if (mine.fd < 0 || (mine.revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
        result = SendWait::kReady;
        break;
      }
      if (Clock::now() >= deadline) break;
    }
    if (mine.fd >= 0) mine.events = POLLIN;
    return result;
  }
  // Another thread is the receiver.
  while (true) {
    pollfd fds[2] = {{peers_[peer_rank]->fd, POLLOUT, 0}, {stop_fd_, POLLIN, 0}};
    const int rc = ::poll(fds, 2, PollTimeoutMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return SendWait::kTimeout;
    if (fds[1].revents & POLLIN) return SendWait::kStopped;
    return SendWait::kReady;
  }
}

void TcpTransport::Abort(const Status& reason) {
  mailbox_.Poison(reason);
  // A full mesh heard the first aborter itself; pair by pair, each rank relays once.
  if ((IsRelayedAbort(reason) && !sparse()) || closed_.load() || abort_sent_.exchange(true)) return;
  const std::string body =
      ErrorBody(reason).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const ConstBytes part(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  const Deadline deadline = Clock::now() + kAbortSendTimeout;
  for (int p = 0; p < size(); ++p) {
    if (p == rank_ || mailbox_.PeerGone(p) || !Reached(p)) continue;
    (void)SendFrame(p, FrameKind::kAbort, std::span<const ConstBytes>(&part, 1), deadline);
  }
}

void TcpTransport::Close() {
  if (closed_.exchange(true)) return;
  mailbox_.Poison(Unavailable("the transport of rank " + std::to_string(rank_) + " is closed"));
  const uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof(one));  // wakes the receiver and blocked senders
  // Best effort and never blocking (stop_fd_ is readable now): a peer that does
  // not read sees EOF without a goodbye, i.e. this rank as lost.
  const Deadline deadline = Clock::now() + kGoodbyeLockTimeout;
  for (int p = 0; p < size(); ++p) {
    if (p != rank_ && peers_[p]->fd >= 0) (void)SendFrame(p, FrameKind::kGoodbye, {}, deadline);
  }
  {
    // A thread acting as the receiver sees stop_fd_ and lets go.
    MutexLock rx(rx_mu_);
    for (pollfd& p : rx_fds_) p.fd = -1;
  }
  for (auto& peer : peers_) {
    MutexLock lock(peer->send_mu);
    if (peer->fd < 0) continue;
    // Closing with unread bytes would send a reset instead of a FIN, and a reset
    // may discard what this rank sent last; read what is there first.
    uint8_t scratch[4096];
    while (::recv(peer->fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0) {
    }
    ::close(peer->fd);
    peer->fd = -1;
  }
  ::close(stop_fd_);
}

}  // namespace tessera::collectives
