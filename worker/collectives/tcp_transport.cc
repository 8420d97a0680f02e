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

}  // namespace

struct TcpTransport::Peer {
  int fd = -1;
  std::string address;

  // Not a timed_mutex: gcc 12's ThreadSanitizer does not see its timed locks.
  Mutex send_mu;
  bool stream_broken GUARDED_BY(send_mu) = false;  // a frame was cut short

  // Receive state, touched only by the receiver thread.
  uint8_t header[kFrameHeaderBytes] = {};
  size_t header_filled = 0;
  bool in_payload = false;
  FrameKind kind = FrameKind::kData;
  Buffer payload;
  size_t payload_filled = 0;
  bool said_goodbye = false;
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
  return std::unique_ptr<TcpTransport>(new TcpTransport(o.rank, o.group_id, std::move(peers)));
}


TcpTransport::TcpTransport(int rank, std::string group_id, std::vector<std::unique_ptr<Peer>> peers)
    : rank_(rank),
      group_id_(std::move(group_id)),
      peers_(std::move(peers)),
      mailbox_(rank, static_cast<int>(peers_.size())) {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  receiver_ = std::thread([this] { ReceiveLoop(); });
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
  const std::string who = "rank " + std::to_string(peer_rank) + " (" + peer.address + ")";
  // Contended only while Close or Abort races a send, so polling is cheap enough.
  while (!peer.send_mu.try_lock()) {
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("timed out waiting to send to " + who, {{"peer_rank", peer_rank}});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  MutexLock lock(peer.send_mu, std::adopt_lock);
  if (closed_.load() && kind != FrameKind::kGoodbye) {
    return Unavailable("the transport of rank " + std::to_string(rank_) + " is closed");
  }
  if (peer.stream_broken) {
    return Unavailable("the connection to " + who + " broke earlier", {{"peer_rank", peer_rank}});
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
      pollfd fds[2] = {{peer.fd, POLLOUT, 0}, {stop_fd_, POLLIN, 0}};
      int rc = ::poll(fds, 2, PollTimeoutMs(deadline));
      if (rc < 0 && errno == EINTR) continue;
      if (rc == 0 || (fds[1].revents & POLLIN)) {
        if (sent > 0) peer.stream_broken = true;
        if (rc == 0) {
          return DeadlineExceeded("timed out sending " + std::to_string(total) + " bytes to " +
                                      who + ": it is not reading",
                                  {{"peer_rank", peer_rank}});
        }
        return Unavailable("the transport of rank " + std::to_string(rank_) + " is closed");
      }
      continue;
    }
    peer.stream_broken = true;
    return Unavailable("connection to " + who + " lost while sending: " + BrokenText(errno),
                       {{"peer_rank", peer_rank}});
  }
  return Status::Ok();
}

Status TcpTransport::Recv(int peer, Buffer* message, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  return mailbox_.Take(peer, message, deadline);
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
  if (receiver_.joinable()) receiver_.join();
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

void TcpTransport::ReceiveLoop() {
  const int n = size();
  std::vector<pollfd> fds(n + 1);
  for (int p = 0; p < n; ++p) fds[p] = {p == rank_ ? -1 : peers_[p]->fd, POLLIN, 0};
  fds[n] = {stop_fd_, POLLIN, 0};
  while (true) {
    int rc = ::poll(fds.data(), fds.size(), -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      mailbox_.Poison(Internal("rank " + std::to_string(rank_) + ": poll: " + ErrnoText(errno)));
      return;
    }
    if (fds[n].revents != 0) return;
    for (int p = 0; p < n; ++p) {
      if (fds[p].fd >= 0 && fds[p].revents != 0 && !ReadFrom(p)) fds[p].fd = -1;
    }
  }
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
    uint8_t* dst;
    size_t want;
    if (peer.in_payload) {
      dst = peer.payload.data() + peer.payload_filled;
      want = peer.payload.size() - peer.payload_filled;
    } else {
      dst = peer.header + peer.header_filled;
      want = kFrameHeaderBytes - peer.header_filled;
    }
    ssize_t got = ::recv(peer.fd, dst, want, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      PeerLost(peer_rank, BrokenText(errno));
      return false;
    }
    if (got == 0) {
      if (!peer.said_goodbye) {
        PeerLost(peer_rank, peer.in_payload || peer.header_filled > 0
                                ? "end of stream in the middle of a message (did the process die?)"
                                : "end of stream without a goodbye (did the process die?)");
      }
      return false;
    }
    if (peer.in_payload) {
      peer.payload_filled += static_cast<size_t>(got);
      if (peer.payload_filled == peer.payload.size() && !FinishFrame(peer_rank)) return false;
      continue;
    }
    peer.header_filled += static_cast<size_t>(got);
    if (peer.header_filled < kFrameHeaderBytes) continue;
    auto decoded = wire::DecodeFrameHeader(wire::Bytes(peer.header, kFrameHeaderBytes));
    if (!decoded.ok() || !decoded->value) {
      PeerLost(peer_rank, "corrupt frame header");
      return false;
    }
    peer.kind = decoded->value->kind;
    const uint64_t length = decoded->value->length;
    try {
      peer.payload = mailbox_.Allocate(length);
    } catch (const std::bad_alloc&) {
      PeerLost(peer_rank, "out of memory for a message of " + std::to_string(length) + " bytes");
      return false;
    }
    peer.payload_filled = 0;
    peer.in_payload = true;
    if (length == 0 && !FinishFrame(peer_rank)) return false;
  }
}

bool TcpTransport::FinishFrame(int peer_rank) {
  Peer& peer = *peers_[peer_rank];
  peer.in_payload = false;
  peer.header_filled = 0;
  switch (peer.kind) {
    case FrameKind::kData:
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
