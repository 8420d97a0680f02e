#include "worker/collectives/tcp_transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <utility>

#include "api/status.h"

namespace tessera::collectives {
namespace {

constexpr uint32_t kFrameMagic = 0x46435354;  // "TSCF"
constexpr uint32_t kHelloMagic = 0x48435354;  // "TSCH"
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kFrameHeaderBytes = 16;
// Larger lengths can only come from a corrupt stream; refuse before allocating.
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 40;
constexpr size_t kMaxGroupIdBytes = 4096;
constexpr std::chrono::milliseconds kRetryDelay{20};
constexpr std::chrono::milliseconds kAbortSendTimeout{1000};
// How long Close waits for a sender it woke to let go of a connection.
constexpr std::chrono::milliseconds kGoodbyeLockTimeout{200};

std::string ErrnoText(int err) { return std::strerror(err); }

// The error of a connection that broke: a reset usually means the peer died.
std::string BrokenText(int err) {
  return ErrnoText(err) +
         (err == ECONNRESET || err == EPIPE ? " (did the process die?)" : std::string());
}

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

void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
uint32_t GetU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// "host:port" or "[v6]:port" → (host, port). A "name@" prefix (who listens
// there, for messages) is skipped.
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

// Waits for `events` on `fd`; false at the deadline.
bool WaitFor(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the read/write report the error
  }
}

// Blocking-with-deadline I/O on a non-blocking socket, for the handshake only.
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

struct Hello {
  uint32_t from_rank = 0;
  uint32_t to_rank = 0;
  uint32_t size = 0;
  std::string group_id;
};

std::string EncodeHello(const Hello& h) {
  std::string out;
  PutU32(out, kHelloMagic);
  PutU32(out, kProtocolVersion);
  PutU32(out, h.from_rank);
  PutU32(out, h.to_rank);
  PutU32(out, h.size);
  PutU32(out, static_cast<uint32_t>(h.group_id.size()));
  return out + h.group_id;
}

std::string EncodeReply(bool accepted, const std::string& reason) {
  std::string out;
  PutU32(out, kHelloMagic);
  PutU32(out, accepted ? 1 : 0);
  PutU32(out, static_cast<uint32_t>(reason.size()));
  return out + reason;
}

Result<std::string> ReadString(int fd, size_t max, Deadline deadline, const std::string& what) {
  uint8_t len_bytes[4];
  RETURN_IF_ERROR(ReadFull(fd, len_bytes, 4, deadline, what));
  uint32_t len = GetU32(len_bytes);
  if (len > max) return InvalidArgument(what + ": string of " + std::to_string(len) + " bytes");
  std::string s(len, '\0');
  RETURN_IF_ERROR(ReadFull(fd, s.data(), len, deadline, what));
  return s;
}

std::string Describe(const std::string& group_id, int rank) {
  return "rank " + std::to_string(rank) + " of group '" + group_id + "'";
}

// Connects to rank `peer` at `address` and has the hello accepted.
Result<Fd> ConnectTo(int peer, const std::string& address, const TcpOptions& o, Deadline deadline) {
  const std::string self = Describe(o.group_id, o.rank);
  ASSIGN_OR_RETURN(auto host_port, SplitAddress(address));
  ASSIGN_OR_RETURN(addrinfo * info, Resolve(host_port.first, host_port.second, false));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> info_owner(info, ::freeaddrinfo);
  std::string last_error = "no address";
  while (true) {
    for (addrinfo* ai = info; ai != nullptr; ai = ai->ai_next) {
      Fd fd(
          ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (fd.get() < 0) {
        last_error = "socket: " + ErrnoText(errno);
        continue;
      }
      int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
      if (rc < 0 && errno == EINPROGRESS) {
        if (!WaitFor(fd.get(), POLLOUT, deadline)) break;
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc < 0) {
        last_error = ErrnoText(errno);
        continue;
      }
      SetNoDelay(fd.get());
      const std::string what = "handshake with rank " + std::to_string(peer) + " at " + address;
      std::string hello = EncodeHello({static_cast<uint32_t>(o.rank), static_cast<uint32_t>(peer),
                                       static_cast<uint32_t>(o.size), o.group_id});
      RETURN_IF_ERROR(WriteFull(fd.get(), hello.data(), hello.size(), deadline, what));
      uint8_t head[8];
      RETURN_IF_ERROR(ReadFull(fd.get(), head, sizeof(head), deadline, what));
      ASSIGN_OR_RETURN(std::string reason, ReadString(fd.get(), 1 << 16, deadline, what));
      if (GetU32(head) != kHelloMagic) {
        return Unavailable(self + ": " + address + " (rank " + std::to_string(peer) +
                           ") is not a Tessera collectives endpoint");
      }
      if (GetU32(head + 4) != 1) {
        return InvalidArgument(self + ": rank " + std::to_string(peer) + " at " + address +
                                   " refused the connection: " + reason,
                               {{"peer_rank", peer}});
      }
      return fd;
    }
    if (Clock::now() + kRetryDelay >= deadline) {
      return DeadlineExceeded(self + ": cannot connect to rank " + std::to_string(peer) + " at " +
                                  address + " (" + last_error + ") within " +
                                  std::to_string(o.connect_timeout.count()) + " ms",
                              {{"missing_ranks", {peer}}});
    }
    std::this_thread::sleep_for(kRetryDelay);  // the peer may not listen yet
  }
}

// Reads the hello of a freshly accepted connection; nullopt for a connection that
// is not a Tessera peer (to be dropped).
std::optional<Hello> ReadHello(int fd, Deadline deadline) {
  const std::string what = "reading a hello";
  uint8_t head[24];
  if (!ReadFull(fd, head, sizeof(head), deadline, what).ok() || GetU32(head) != kHelloMagic ||
      GetU32(head + 4) != kProtocolVersion) {
    return std::nullopt;
  }
  Hello h{GetU32(head + 8), GetU32(head + 12), GetU32(head + 16), ""};
  uint32_t id_len = GetU32(head + 20);
  if (id_len > kMaxGroupIdBytes) return std::nullopt;
  h.group_id.resize(id_len);
  if (!ReadFull(fd, h.group_id.data(), id_len, deadline, what).ok()) return std::nullopt;
  return h;
}

// Checks a hello against this rank's options and answers it. Returns the peer's
// rank once accepted; an error for a peer that does not match.
Result<int> AnswerHello(int fd, const Hello& h, const TcpOptions& o, Deadline deadline,
                        const std::set<int>& waiting) {
  const std::string self = Describe(o.group_id, o.rank);
  const int from = static_cast<int>(h.from_rank);
  std::string reason;
  if (h.group_id != o.group_id) {
    reason = "it is in group '" + h.group_id + "', this rank in group '" + o.group_id + "'";
  } else if (static_cast<int>(h.size) != o.size) {
    reason = "rank " + std::to_string(from) + " has world size " + std::to_string(h.size) +
             ", rank " + std::to_string(o.rank) + " has world size " + std::to_string(o.size);
  } else if (static_cast<int>(h.to_rank) != o.rank) {
    reason = "rank " + std::to_string(from) + " meant to reach rank " + std::to_string(h.to_rank) +
             " but reached rank " + std::to_string(o.rank) + " (addresses out of order?)";
  } else if (waiting.count(from) == 0) {
    reason = "rank " + std::to_string(from) +
             (from > o.rank && from < o.size ? " is already connected" : " is not expected here");
  }
  std::string reply = EncodeReply(reason.empty(), reason);
  Status sent = WriteFull(fd, reply.data(), reply.size(), deadline, "answering a hello");
  if (!reason.empty()) {
    return InvalidArgument(self + ": refused a connection from rank " + std::to_string(from) +
                               " of group '" + h.group_id + "': " + reason,
                           {{"peer_rank", from}});
  }
  RETURN_IF_ERROR(sent);
  return from;
}

Status WaitingTimeout(const TcpOptions& o, const std::set<int>& waiting) {
  std::vector<int> missing(waiting.begin(), waiting.end());
  return DeadlineExceeded(Describe(o.group_id, o.rank) + ": timed out after " +
                              std::to_string(o.connect_timeout.count()) +
                              " ms waiting for ranks " + RankList(missing) + " to connect",
                          {{"missing_ranks", missing}});
}

// Accepts one connection from a higher rank. Returns (-1, empty) for a connection
// that is not a Tessera peer (ignored); an error for a peer that does not match.
Result<std::pair<int, Fd>> AcceptOne(int listen_fd, const TcpOptions& o, Deadline deadline,
                                     const std::set<int>& waiting) {
  if (!WaitFor(listen_fd, POLLIN, deadline)) return WaitingTimeout(o, waiting);
  Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (fd.get() < 0) return std::make_pair(-1, Fd());  // e.g. the client gave up already
  SetNoDelay(fd.get());
  std::optional<Hello> h = ReadHello(fd.get(), deadline);
  if (!h) return std::make_pair(-1, Fd());
  ASSIGN_OR_RETURN(int from, AnswerHello(fd.get(), *h, o, deadline, waiting));
  return std::make_pair(from, std::move(fd));
}

// True while the peer has neither closed nor sent anything past its hello.
bool StillWaiting(int fd) {
  uint8_t byte;
  ssize_t r = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

// ---- TcpListener ----

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
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
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

// ---- TcpTransport ----

struct TcpTransport::Peer {
  int fd = -1;
  std::string address;

  // Not a timed_mutex: gcc 12's ThreadSanitizer does not see its timed locks.
  std::mutex send_mu;
  bool stream_broken = false;  // GUARDED_BY(send_mu): a frame was cut short

  // Receive state, touched only by the receiver thread.
  uint8_t header[kFrameHeaderBytes] = {};
  size_t header_filled = 0;
  bool in_payload = false;
  FrameKind kind = FrameKind::kData;
  Buffer payload;
  size_t payload_filled = 0;
  bool said_goodbye = false;
};

struct TcpAcceptor::Pending {
  Hello hello;
  Fd fd;
  Clock::time_point arrived;
};

Result<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    std::unique_ptr<TcpListener> listener, const std::vector<std::string>& addresses,
    const TcpOptions& o) {
  if (listener == nullptr) return InvalidArgument("TcpTransport::Connect needs a listener");
  return Join(addresses, o, [&](Deadline deadline, const std::set<int>& waiting) {
    return AcceptOne(listener->fd_, o, deadline, waiting);
  });
}

Result<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    TcpAcceptor& acceptor, const std::vector<std::string>& addresses, const TcpOptions& o) {
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

// ---- TcpAcceptor ----

Result<std::unique_ptr<TcpAcceptor>> TcpAcceptor::Start(std::unique_ptr<TcpListener> listener) {
  if (listener == nullptr) return InvalidArgument("TcpAcceptor::Start needs a listener");
  int stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) return Unavailable("eventfd: " + ErrnoText(errno));
  return std::unique_ptr<TcpAcceptor>(new TcpAcceptor(std::move(listener), stop_fd));
}

TcpAcceptor::TcpAcceptor(std::unique_ptr<TcpListener> listener, int stop_fd)
    : listener_(std::move(listener)), stop_fd_(stop_fd) {
  thread_ = std::thread([this] { AcceptLoop(); });
}

TcpAcceptor::~TcpAcceptor() {
  uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof(one));
  thread_.join();
  ::close(stop_fd_);
}

void TcpAcceptor::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listener_->fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    int rc = ::poll(fds, 2, 1000);
    if (rc < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    {
      // Connections nobody took (their group never formed here) expire.
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        it = now - it->second->arrived > kPendingLifetime ? pending_.erase(it) : std::next(it);
      }
    }
    if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    Fd fd(::accept4(listener_->fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.get() < 0) continue;
    SetNoDelay(fd.get());
    // A hello is a few bytes sent right after connecting; a client that is slower
    // than this is not a peer.
    std::optional<Hello> hello = ReadHello(fd.get(), Clock::now() + kHelloTimeout);
    if (!hello) continue;
    auto pending = std::make_unique<Pending>();
    pending->hello = std::move(*hello);
    pending->fd = std::move(fd);
    pending->arrived = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    pending_.emplace(pending->hello.group_id, std::move(pending));
    cv_.notify_all();
  }
}

std::unique_ptr<TcpAcceptor::Pending> TcpAcceptor::Take(const std::string& group_id,
                                                          Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    for (auto it = pending_.find(group_id); it != pending_.end() && it->first == group_id;) {
      std::unique_ptr<Pending> p = std::move(it->second);
      it = pending_.erase(it);
      // A peer that gave up (an earlier attempt to form the group) has closed.
      if (!StillWaiting(p->fd.get())) continue;
      return p;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      auto it = pending_.find(group_id);
      if (it == pending_.end()) return nullptr;
    }
  }
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
  std::unique_lock lock(peer.send_mu, std::try_to_lock);
  while (!lock.owns_lock()) {
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("timed out waiting to send to " + who, {{"peer_rank", peer_rank}});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)lock.try_lock();
  }
  if (closed_.load() && kind != FrameKind::kGoodbye) {
    return Unavailable("the transport of rank " + std::to_string(rank_) + " is closed");
  }
  if (peer.stream_broken) {
    return Unavailable("the connection to " + who + " broke earlier", {{"peer_rank", peer_rank}});
  }
  uint64_t length = 0;
  for (ConstBytes part : parts) length += part.size();
  uint8_t header[kFrameHeaderBytes];
  const uint32_t magic = kFrameMagic;
  const uint32_t kind_value = static_cast<uint32_t>(kind);
  std::memcpy(header, &magic, 4);
  std::memcpy(header + 4, &kind_value, 4);
  std::memcpy(header + 8, &length, 8);

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
    std::lock_guard lock(peer->send_mu);
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
    uint32_t magic, kind;
    uint64_t length;
    std::memcpy(&magic, peer.header, 4);
    std::memcpy(&kind, peer.header + 4, 4);
    std::memcpy(&length, peer.header + 8, 8);
    if (magic != kFrameMagic || kind < 1 || kind > 3 || length > kMaxFrameBytes) {
      PeerLost(peer_rank, "corrupt frame header");
      return false;
    }
    peer.kind = static_cast<FrameKind>(kind);
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
      Status reason = Internal("unreadable abort message");
      if (body.is_object() && body.contains("error") && body["error"].is_object()) {
        const auto& e = body["error"];
        reason = Status(CodeFromName(e.value("code", "internal")), e.value("message", ""),
                        e.contains("details") ? e["details"] : nlohmann::json());
      }
      mailbox_.Poison(AbortedBy(peer_rank, reason));
      return true;
    }
  }
  return false;
}

}  // namespace tessera::collectives
