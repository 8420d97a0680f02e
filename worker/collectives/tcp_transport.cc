#include "worker/collectives/tcp_transport.h"

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
#include "worker/collectives/tcp_handshake.h"
#include "worker/collectives/tcp_socket.h"

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
// A sched_yield(2) that takes longer than this ran another thread: alone on its
// CPU it returns within a microsecond or two.
constexpr std::chrono::microseconds kYieldRanAnother{5};

}  // namespace

// Staged reads: a frame header is read with whatever follows it, up to this
// many bytes, so that small frames come many to a recv(2); a payload's rest
// larger than half of it is read straight into its destination.
constexpr size_t kStageBytes = 16 << 10;

struct TcpTransport::Peer {
  int fd = -1;
  std::string address;

  // Not a timed_mutex: gcc 12's ThreadSanitizer does not see its timed locks.
  Mutex send_mu;
  bool stream_broken GUARDED_BY(send_mu) = false;  // a frame was cut short

  // Receive state, touched only by the thread holding the transport's rx_mu_.
  std::unique_ptr<uint8_t[]> stage{new uint8_t[kStageBytes]};
  size_t stage_begin = 0, stage_end = 0;  // the staged bytes not consumed yet
  bool in_payload = false;
  FrameKind kind = FrameKind::kData;
  Buffer payload;
  uint8_t* dst = nullptr;  // where the payload goes: payload.data() or `target`
  size_t length = 0, filled = 0;
  // Set by RecvInto while it waits: the next data frame of this length lands
  // here, and `target_filled` says when it has.
  std::span<uint8_t> target;
  bool target_filled = false;
  bool into_target = false;  // the frame in progress goes to `target`
  bool said_goodbye = false;

  size_t staged() const { return stage_end - stage_begin; }
};

Result<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    std::unique_ptr<TcpListener> listener, const std::vector<std::string>& addresses,
    const TcpOptions& o) {
  if (listener == nullptr) return InvalidArgument("TcpTransport::Connect needs a listener");
  return Join(addresses, o, [&](Deadline deadline, const std::set<int>& waiting) {
    return AcceptOne(listener->fd_, listener->address(), o, deadline, waiting);
  });
}

Result<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    TcpAcceptor& acceptor, const std::vector<std::string>& addresses, const TcpOptions& options) {
  TcpOptions o = options;
  o.key = acceptor.key_;
  return Join(addresses, o,
              [&](Deadline deadline, const std::set<int>& waiting) -> Result<std::pair<int, Fd>> {
                std::unique_ptr<TcpAcceptor::Pending> incoming =
                    acceptor.Take(o.group_id, deadline);
                if (!incoming) return WaitingTimeout(o, waiting);
                ASSIGN_OR_RETURN(int from, AnswerHello(incoming->fd.get(), incoming->hello, o,
                                                       deadline, waiting));
                return std::make_pair(from, std::move(incoming->fd));
              });
}

template <typename AcceptFn>
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

Status TcpTransport::Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
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

Status TcpTransport::Recv(int peer, Buffer* message, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  return Receive(peer, message, nullptr, deadline);
}

Status TcpTransport::RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  return Receive(peer, nullptr, &dst, deadline);
}

Status TcpTransport::Receive(int peer_rank, Buffer* message, std::span<uint8_t>* dst,
                             Deadline deadline) {
  Buffer scratch;
  Buffer* out = dst != nullptr ? &scratch : message;
  // A message that came into the queue (read by another thread, or before the
  // caller asked for it) is copied out of it.
  auto taken = [&]() -> Status {
    if (dst == nullptr) return Status::Ok();
    if (scratch.size() != dst->size()) {
      Status st = WrongMessageSize(peer_rank, dst->size(), scratch.size());
      Abort(st);
      return st;
    }
    CopyBytes(dst->data(), scratch.data(), dst->size());
    return Status::Ok();
  };
  Peer& peer = *peers_[peer_rank];
  if (dst != nullptr) {
    // A posted target that is filled holds the next message: anything queued
    // came after it.
    MutexLock rx(rx_mu_);
    if (peer.target_filled && peer.target.data() == dst->data() &&
        peer.target.size() == dst->size()) {
      Untarget(peer_rank);
      return Status::Ok();
    }
  }
  while (true) {
    ASSIGN_OR_RETURN(bool queued, mailbox_.TryTake(peer_rank, out));
    if (queued) return taken();
    if (Clock::now() >= deadline) break;
    if (!rx_mu_.try_lock()) {
      // Another thread is the receiver: it queues what comes for this one.
      mailbox_.Wait(peer_rank, std::min(deadline, Clock::now() + std::chrono::milliseconds(1)));
      continue;
    }
    MutexLock rx(rx_mu_, std::adopt_lock);
    // Closed: the mailbox says so. Queued by the previous receiver meanwhile: it
    // comes first.
    if (closed_.load() || mailbox_.Ready(peer_rank)) continue;
    // The next data frame lands in `dst` (posted already, or now) unless one of
    // `peer` has begun arriving already.
    const bool direct =
        dst != nullptr && ((peer.target.data() == dst->data() && peer.target.size() == dst->size()) ||
                           Target(peer_rank, *dst));
    auto ready = [&] {
      return (direct && peer.target_filled) || mailbox_.Ready(peer_rank);
    };
    Pump(0);  // what is there already
    if (!ready()) {
      waits_.fetch_add(1, std::memory_order_relaxed);
      // Spin. In a call bound by latency, once a yield ran another thread this
      // CPU is shared (more runnable threads than cores, as with several ranks
      // on one host): polling on would only take turns from the threads that
      // this rank waits for, while sleeping hands them the CPU at once. Bulk
      // transfers keep spinning: their ranks lost more to the wake-ups (4 ranks
      // on 2 vCPUs, 64 KiB - 1 MiB all-reduces; README, Benchmarks).
      const bool cut = latency_bound_.load(std::memory_order_relaxed);
      Deadline spin_until = std::min(deadline, Clock::now() + spin_);
      while (!ready() && Clock::now() < spin_until) {
        const Clock::time_point before = Clock::now();
        std::this_thread::yield();
        const Clock::time_point after = Clock::now();
        if (cut && after - before > kYieldRanAnother) {
          spin_until = after;
          spins_cut_.fetch_add(1, std::memory_order_relaxed);
        }
        Pump(0);
      }
      if (!ready()) sleeps_.fetch_add(1, std::memory_order_relaxed);
      while (!ready() && Clock::now() < deadline) {
        if (Pump(PollTimeoutMs(deadline))) break;  // closing
      }
    }
    if (direct) {
      const bool filled = peer.target_filled;
      Untarget(peer_rank);
      if (filled) return Status::Ok();
    }
  }
  // Past the deadline: the mailbox tells a message that just came from an error
  // that explains the wait, and both from a timeout.
  RETURN_IF_ERROR(mailbox_.Take(peer_rank, out, deadline));
  return taken();
}

bool TcpTransport::Target(int peer_rank, std::span<uint8_t> dst) {
  Peer& peer = *peers_[peer_rank];
  if (peer.in_payload || mailbox_.Ready(peer_rank)) return false;
  peer.target = dst;
  peer.target_filled = false;
  return true;
}

void TcpTransport::Untarget(int peer_rank) {
  Peer& peer = *peers_[peer_rank];
  if (peer.into_target) {
    Buffer rest = mailbox_.Allocate(peer.length);
    CopyBytes(rest.data(), peer.target.data(), peer.filled);
    peer.payload = std::move(rest);
    peer.dst = peer.payload.data();
    peer.into_target = false;
  }
  peer.target = {};
  peer.target_filled = false;
}

Status TcpTransport::Poll() {
  if (!closed_.load() && rx_mu_.try_lock()) {
    MutexLock rx(rx_mu_, std::adopt_lock);
    if (!closed_.load()) Pump(0);
  }
  return status();
}

void TcpTransport::PostRecv(int peer_rank, std::span<uint8_t> dst) {
  if (CheckPeerRank(rank_, size(), peer_rank).ok() && !closed_.load()) {
    MutexLock rx(rx_mu_);
    if (!closed_.load()) (void)Target(peer_rank, dst);
  }
}

void TcpTransport::CancelRecv(int peer_rank) {
  if (!CheckPeerRank(rank_, size(), peer_rank).ok()) return;
  MutexLock rx(rx_mu_);
  Untarget(peer_rank);
}

bool TcpTransport::Pump(int timeout_ms) {
  const int n = size();
  for (pollfd& p : rx_fds_) p.revents = 0;
  int rc = ::poll(rx_fds_.data(), rx_fds_.size(), timeout_ms);
  if (rc < 0) {
    if (errno == EINTR) return false;
    mailbox_.Poison(Internal("rank " + std::to_string(rank_) + ": poll: " + ErrnoText(errno)));
    return true;
  }
  if (rx_fds_[n].revents != 0) return true;
  for (int p = 0; p < n && rc > 0; ++p) {
    pollfd& f = rx_fds_[p];
    if (f.fd < 0 || (f.revents & (POLLIN | POLLERR | POLLHUP)) == 0) continue;
    if (!ReadFrom(p)) f.fd = -1;
  }
  return false;
}

void TcpTransport::Abort(const Status& reason) {
  mailbox_.Poison(reason);
  if (IsRelayedAbort(reason) || closed_.load() || abort_sent_.exchange(true)) return;
  const std::string body =
      ErrorBody(reason).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const ConstBytes part(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  const Deadline deadline = Clock::now() + kAbortSendTimeout;
  for (int p = 0; p < size(); ++p) {
    if (p == rank_ || mailbox_.PeerGone(p)) continue;
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

void TcpTransport::PeerLost(int peer_rank, const std::string& why) {
  mailbox_.MarkPeerGone(peer_rank,
                        Unavailable("connection to rank " + std::to_string(peer_rank) + " (" +
                                        peers_[peer_rank]->address + ") lost: " + why,
                                    {{"peer_rank", peer_rank}}));
}

bool TcpTransport::ReadFrom(int peer_rank) {
  Peer& peer = *peers_[peer_rank];
  while (true) {
    // Staged bytes first: the rest of a payload, or whole frames.
    if (peer.in_payload) {
      const size_t take = std::min(peer.staged(), peer.length - peer.filled);
      CopyBytes(peer.dst + peer.filled, peer.stage.get() + peer.stage_begin, take);
      peer.stage_begin += take;
      peer.filled += take;
      if (peer.filled == peer.length) {
        if (!FinishFrame(peer_rank)) return false;
        continue;
      }
    } else if (peer.staged() >= kFrameHeaderBytes) {
      if (!StartFrame(peer_rank)) return false;
      continue;
    }
    // The stage is empty, or holds part of a header: read more.
    uint8_t* into;
    size_t want;
    const size_t rest = peer.in_payload ? peer.length - peer.filled : 0;
    const bool straight = rest > kStageBytes / 2;
    if (straight) {
      into = peer.dst + peer.filled;
      want = rest;
    } else {
      if (peer.stage_begin > 0) {
        std::memmove(peer.stage.get(), peer.stage.get() + peer.stage_begin, peer.staged());
        peer.stage_end -= peer.stage_begin;
        peer.stage_begin = 0;
      }
      into = peer.stage.get() + peer.stage_end;
      want = kStageBytes - peer.stage_end;
    }
    ssize_t got = ::recv(peer.fd, into, want, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      PeerLost(peer_rank, BrokenText(errno));
      return false;
    }
    if (got == 0) {
      if (!peer.said_goodbye) {
        PeerLost(peer_rank, peer.in_payload || peer.staged() > 0
                                ? "end of stream in the middle of a message (did the process die?)"
                                : "end of stream without a goodbye (did the process die?)");
      }
      return false;
    }
    if (straight) {
      peer.filled += static_cast<size_t>(got);
      if (peer.filled == peer.length && !FinishFrame(peer_rank)) return false;
    } else {
      peer.stage_end += static_cast<size_t>(got);
    }
    // A short read emptied the socket: what is staged is handled on the next
    // pass, and no recv(2) needs to say EAGAIN.
    if (static_cast<size_t>(got) < want) {
      while (peer.in_payload ? peer.staged() > 0 : peer.staged() >= kFrameHeaderBytes) {
        if (peer.in_payload) {
          const size_t take = std::min(peer.staged(), peer.length - peer.filled);
          CopyBytes(peer.dst + peer.filled, peer.stage.get() + peer.stage_begin, take);
          peer.stage_begin += take;
          peer.filled += take;
          if (peer.filled == peer.length && !FinishFrame(peer_rank)) return false;
        } else if (!StartFrame(peer_rank)) {
          return false;
        }
      }
      return true;
    }
  }
}

bool TcpTransport::StartFrame(int peer_rank) {
  Peer& peer = *peers_[peer_rank];
  auto decoded = wire::DecodeFrameHeader(
      wire::Bytes(peer.stage.get() + peer.stage_begin, kFrameHeaderBytes));
  if (!decoded.ok() || !decoded->value) {
    PeerLost(peer_rank, "corrupt frame header");
    return false;
  }
  peer.stage_begin += kFrameHeaderBytes;
  peer.kind = decoded->value->kind;
  peer.length = decoded->value->length;
  peer.filled = 0;
  peer.in_payload = true;
  peer.into_target = peer.kind == FrameKind::kData && !peer.target_filled &&
                     peer.target.data() != nullptr && peer.target.size() == peer.length;
  if (peer.into_target) {
    peer.dst = peer.target.data();
  } else {
    try {
      peer.payload = mailbox_.Allocate(peer.length);
    } catch (const std::bad_alloc&) {
      PeerLost(peer_rank,
               "out of memory for a message of " + std::to_string(peer.length) + " bytes");
      return false;
    }
    peer.dst = peer.payload.data();
  }
  if (peer.length == 0) return FinishFrame(peer_rank);
  return true;
}

bool TcpTransport::FinishFrame(int peer_rank) {
  Peer& peer = *peers_[peer_rank];
  peer.in_payload = false;
  switch (peer.kind) {
    case FrameKind::kData:
      if (peer.into_target) {
        peer.into_target = false;
        peer.target_filled = true;  // the target stays until Untarget
        return true;
      }
      mailbox_.Deliver(peer_rank, std::move(peer.payload));
      peer.payload = Buffer();
      return true;
    case FrameKind::kGoodbye:
      peer.said_goodbye = true;
      mailbox_.MarkPeerGone(
          peer_rank, Unavailable("rank " + std::to_string(peer_rank) + " closed its transport",
                                 {{"peer_rank", peer_rank}}));
      return true;
    case FrameKind::kAbort: {
      auto body = nlohmann::json::parse(peer.payload.data(),
                                        peer.payload.data() + peer.payload.size(), nullptr, false);
      mailbox_.Poison(AbortedBy(peer_rank, StatusFromErrorJson(body, "unreadable abort message")));
      return true;
    }
  }
  return false;
}

}  // namespace tessera::collectives
