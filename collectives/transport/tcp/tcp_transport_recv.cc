// The receive side of TcpTransport: receives that wait for a frame (or a frame of
// a given length into the caller's memory), the pump that reads every connection,
// and the framing of what arrives. The send side and the connection's life are in
// tcp_transport.cc.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <utility>

#include "api/status.h"
#include "collectives/transport/tcp/tcp_peer.h"
#include "collectives/transport/tcp/tcp_socket.h"

namespace tessera::collectives {
namespace {

using tcp::ErrnoText;
using tcp::BrokenText;
using wire::kFrameHeaderBytes;

// A sched_yield(2) that takes longer than this ran another thread: alone on its
// CPU it returns within a microsecond or two.
constexpr std::chrono::microseconds kYieldRanAnother{5};

}  // namespace

Status TcpTransport::Recv(int peer, Buffer* message, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  RETURN_IF_ERROR(CheckReached(peer));
  return Receive(peer, message, nullptr, deadline);
}

Status TcpTransport::RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  RETURN_IF_ERROR(CheckReached(peer));
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
