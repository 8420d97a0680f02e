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
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <utility>

#include "api/status.h"

namespace tessera::collectives {
namespace {

using wire::kFrameHeaderBytes;
using wire::kMaxGroupIdBytes;

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

std::string Describe(const std::string& group_id, int rank) {
  return "rank " + std::to_string(rank) + " of group '" + group_id + "'";
}

// Reads one whole message that starts with the bytes `buf` already holds,
// asking the decoder how much more it needs.
template <typename T>
Result<T> ReadMessage(int fd, Result<wire::Decoded<T>> (*decode)(wire::Bytes), std::string buf,
                      Deadline deadline, const std::string& what) {
  while (true) {
    auto decoded = decode(wire::AsBytes(buf));
    if (!decoded.ok()) return Unavailable(what + ": " + decoded.status().message());
    if (decoded->value) return std::move(*decoded->value);
    const size_t have = buf.size();
    buf.resize(decoded->length);
    RETURN_IF_ERROR(ReadFull(fd, buf.data() + have, buf.size() - have, deadline, what));
  }
}

// The connecting side of the handshake (tcp_wire.h) on a fresh connection to
// rank `peer` at `address`: hello, check the acceptor's proof, prove, verdict.
Status ClientHandshake(int fd, int peer, const std::string& address, const TcpOptions& o,
                       Deadline deadline) {
  const std::string self = Describe(o.group_id, o.rank);
  const std::string them = "rank " + std::to_string(peer) + " at " + address;
  const std::string what = "handshake with " + them;
  wire::Hello hello{static_cast<uint32_t>(o.rank), static_cast<uint32_t>(peer),
                    static_cast<uint32_t>(o.size), o.group_id, {}};
  RETURN_IF_ERROR(RandomBytes(hello.nonce));
  const std::string hello_bytes = wire::EncodeHello(hello);
  RETURN_IF_ERROR(WriteFull(fd, hello_bytes.data(), hello_bytes.size(), deadline, what));

  // A challenge, or a reply refusing at once (a data port of another version).
  std::string first(4, '\0');
  if (Status st = ReadFull(fd, first.data(), first.size(), deadline, what); !st.ok()) {
    if (st.code() != Code::kUnavailable) return st;
    return Unavailable(self + ": " + st.message() +
                           " before answering the hello (a data port of another version?)",
                       {{"peer_rank", peer}});
  }
  const uint32_t magic = wire::PeekMagic(wire::AsBytes(first)).value_or(0);
  if (magic != wire::kChallengeMagic && magic != wire::kHelloMagic) {
    return Unavailable(self + ": " + address + " (rank " + std::to_string(peer) +
                       ") is not a Tessera collectives endpoint");
  }
  if (magic == wire::kChallengeMagic) {
    ASSIGN_OR_RETURN(wire::Challenge challenge,
                     ReadMessage(fd, &wire::DecodeChallenge, std::move(first), deadline, what));
    ASSIGN_OR_RETURN(Mac expected, wire::HandshakeMac(o.key, wire::Side::kAcceptor,
                                                      wire::AsBytes(hello_bytes), challenge.nonce));
    if (!ConstantTimeEqual(expected, challenge.mac)) {
      return Status(Code::kUnauthenticated,
                    self + ": the data port at " + address + " (rank " + std::to_string(peer) +
                        ") did not prove it knows the cluster secret (are both given the same "
                        "token?)",
                    {{"peer_rank", peer}});
    }
    ASSIGN_OR_RETURN(Mac mine, wire::HandshakeMac(o.key, wire::Side::kConnector,
                                                  wire::AsBytes(hello_bytes), challenge.nonce));
    const std::string proof = wire::EncodeProof({mine});
    RETURN_IF_ERROR(WriteFull(fd, proof.data(), proof.size(), deadline, what));
    first.clear();
  }
  ASSIGN_OR_RETURN(wire::Reply reply,
                   ReadMessage(fd, &wire::DecodeReply, std::move(first), deadline, what));
  if (!reply.accepted) {
    return InvalidArgument(self + ": " + them + " refused the connection: " + reply.reason,
                           {{"peer_rank", peer}});
  }
  return Status::Ok();
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
      RETURN_IF_ERROR(ClientHandshake(fd.get(), peer, address, o, deadline));
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

// "10.0.0.5:51234" or "[::1]:51234": the other end of an accepted connection.
std::string RemoteName(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), port,
                    sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return addr.ss_family == AF_INET6 ? "[" + std::string(host) + "]:" + port
                                    : std::string(host) + ":" + port;
}

// A stranger's group id, fit for one line of a log: printable ASCII, the rest
// escaped, cut short.
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

// The accepting side of the handshake (tcp_wire.h) of one connection. Driven by
// the socket's readiness, so that one thread can run many at once; a blocking
// caller polls events() itself.
class ServerHandshake {
 public:
  ServerHandshake(Fd fd, std::string remote, const DataPortKey& key, Deadline deadline)
      : fd_(std::move(fd)), remote_(std::move(remote)), key_(key), deadline_(deadline) {}

  // Does what the socket allows now. true: the peer proved it knows the key
  // (hello() is its hello); false: wait for events() on fd(), until deadline();
  // an error: refuse the connection, for that reason.
  Result<bool> Step() {
    while (true) {
      switch (stage_) {
        case Stage::kHello:
        case Stage::kProof: {
          ASSIGN_OR_RETURN(std::optional<size_t> want, Consume());
          if (!want) continue;  // a whole message: the stage moved on
          const size_t have = in_.size();
          in_.resize(*want);
          const ssize_t r = ::recv(fd_.get(), in_.data() + have, *want - have, 0);
          in_.resize(have + static_cast<size_t>(std::max<ssize_t>(r, 0)));
          if (r > 0) continue;
          if (r == 0) return Unavailable(ClosedText());
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
          return Unavailable("the connection broke: " + BrokenText(errno));
        }
        case Stage::kChallenge:
        case Stage::kRefusing: {
          const ssize_t w = ::send(fd_.get(), out_.data() + out_sent_, out_.size() - out_sent_,
                                   MSG_NOSIGNAL);
          if (w < 0 && errno == EINTR) continue;
          if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
          if (w < 0) {
            if (stage_ == Stage::kRefusing) return refusal_;
            return Unavailable("the connection broke: " + BrokenText(errno));
          }
          out_sent_ += static_cast<size_t>(w);
          if (out_sent_ < out_.size()) continue;
          if (stage_ == Stage::kRefusing) return refusal_;
          stage_ = Stage::kProof;
          continue;
        }
        case Stage::kDone:
          return true;
      }
    }
  }

  // The error of a handshake still unfinished at its deadline.
  Status TimedOut() const {
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - started_).count();
    return DeadlineExceeded(stage_ == Stage::kHello
                                ? "it sent no whole hello within " + std::to_string(ms) + " ms"
                                : "it did not complete the handshake within " +
                                      std::to_string(ms) + " ms");
  }

  int fd() const { return fd_.get(); }
  short events() const {
    return stage_ == Stage::kChallenge || stage_ == Stage::kRefusing ? POLLOUT : POLLIN;
  }
  Deadline deadline() const { return deadline_; }
  const std::string& remote() const { return remote_; }
  // REQUIRES: Step() returned true.
  const wire::Hello& hello() const { return *hello_; }
  Fd TakeFd() { return std::move(fd_); }

  // " (claiming to be rank 1 of group 'g')", once its hello was read.
  std::string Claim() const {
    if (!hello_) return "";
    return " (claiming to be rank " + std::to_string(hello_->from_rank) + " of group '" +
           Printable(hello_->group_id) + "')";
  }

 private:
  enum class Stage { kHello, kChallenge, kProof, kRefusing, kDone };

  // Decodes what in_ holds. nullopt: it held a whole message, acted upon (the
  // stage moved on); else how many bytes in_ must hold to go on.
  Result<std::optional<size_t>> Consume() {
    if (stage_ == Stage::kHello) {
      auto decoded = wire::DecodeHello(wire::AsBytes(in_));
      if (!decoded.ok()) {
        const nlohmann::json& d = decoded.status().details();
        if (d.is_object() && d.contains("peer_version")) {
          // Another release: tell it why (version 1 peers read this reply too).
          out_ = wire::EncodeReply({false, "this data port speaks collectives protocol version " +
                                               std::to_string(wire::kProtocolVersion) +
                                               ", the connecting peer version " +
                                               d["peer_version"].dump() +
                                               " (are all workers of one release?)"});
          stage_ = Stage::kRefusing;
          refusal_ = InvalidArgument("it speaks collectives protocol version " +
                                     d["peer_version"].dump() + ", this data port version " +
                                     std::to_string(wire::kProtocolVersion));
          return std::optional<size_t>();
        }
        return InvalidArgument("it sent no Tessera hello: " + decoded.status().message());
      }
      if (!decoded->value) return std::optional<size_t>(decoded->length);
      hello_ = std::move(*decoded->value);
      hello_bytes_ = std::move(in_);
      in_.clear();
      wire::Challenge challenge;
      RETURN_IF_ERROR(RandomBytes(challenge.nonce));
      nonce_s_ = challenge.nonce;
      ASSIGN_OR_RETURN(challenge.mac, wire::HandshakeMac(key_, wire::Side::kAcceptor,
                                                         wire::AsBytes(hello_bytes_), nonce_s_));
      out_ = wire::EncodeChallenge(challenge);
      out_sent_ = 0;
      stage_ = Stage::kChallenge;
      return std::optional<size_t>();
    }
    auto decoded = wire::DecodeProof(wire::AsBytes(in_));
    if (!decoded.ok()) {
      return InvalidArgument("it answered the challenge with something else: " +
                             decoded.status().message());
    }
    if (!decoded->value) return std::optional<size_t>(decoded->length);
    ASSIGN_OR_RETURN(Mac expected, wire::HandshakeMac(key_, wire::Side::kConnector,
                                                      wire::AsBytes(hello_bytes_), nonce_s_));
    if (!ConstantTimeEqual(expected, decoded->value->mac)) {
      return Status(Code::kUnauthenticated,
                    "its proof is wrong: it does not know the cluster secret (another token?)");
    }
    stage_ = Stage::kDone;
    return std::optional<size_t>();
  }

  std::string ClosedText() const {
    if (stage_ == Stage::kProof) {
      return "it closed the connection instead of proving it knows the cluster secret (another "
             "token?)";
    }
    return in_.empty() ? "it closed the connection without a hello"
                       : "it closed the connection in the middle of its hello";
  }

  Fd fd_;
  std::string remote_;
  const DataPortKey& key_;
  const Deadline started_ = Clock::now();
  Deadline deadline_;
  Stage stage_ = Stage::kHello;
  std::string in_;  // the message being read
  std::string hello_bytes_;
  std::optional<wire::Hello> hello_;
  Nonce nonce_s_{};
  std::string out_;  // the message being written
  size_t out_sent_ = 0;
  Status refusal_;  // kRefusing: the error once the reply is out
};

// Every refusal of the process: counted, and logged to stderr at most once a
// second (the lines a flood would add are counted and summed up instead).
std::atomic<uint64_t> g_refused{0};

struct RefusalLog {
  Mutex mu;
  Clock::time_point last GUARDED_BY(mu) = {};  // of the last line
  uint64_t unlogged GUARDED_BY(mu) = 0;        // refusals since then, not logged
};

RefusalLog& TheRefusalLog() {
  static RefusalLog* log = new RefusalLog;  // never destroyed: acceptor threads may outlive statics
  return *log;
}

constexpr std::chrono::seconds kRefusalLogInterval{1};

std::string Unlogged(uint64_t n) {
  return std::to_string(n) + " more connection" + (n == 1 ? " was" : "s were") +
         " refused, not logged";
}

void NoteRefusal(std::atomic<uint64_t>* counter, const std::string& port,
                 const ServerHandshake& h, const Status& why) {
  if (counter != nullptr) counter->fetch_add(1);
  const uint64_t total = g_refused.fetch_add(1) + 1;
  RefusalLog& log = TheRefusalLog();
  MutexLock lock(log.mu);
  const auto now = Clock::now();
  if (log.last != Clock::time_point{} && now - log.last < kRefusalLogInterval) {
    ++log.unlogged;
    return;
  }
  std::string earlier = log.unlogged > 0 ? "; before it, " + Unlogged(log.unlogged) : "";
  std::fprintf(stderr, "%s: refused a connection from %s%s: %s (%llu refused in all%s)\n",
               port.c_str(), h.remote().c_str(), h.Claim().c_str(), why.message().c_str(),
               static_cast<unsigned long long>(total), earlier.c_str());
  log.last = now;
  log.unlogged = 0;
}

// Logs the refusals a flood kept from the log, once their second is over.
void FlushRefusalLog(const std::string& port) {
  RefusalLog& log = TheRefusalLog();
  MutexLock lock(log.mu);
  const auto now = Clock::now();
  if (log.unlogged == 0 || now - log.last < kRefusalLogInterval) return;
  std::fprintf(stderr, "%s: %s (%llu refused in all)\n", port.c_str(),
               Unlogged(log.unlogged).c_str(), static_cast<unsigned long long>(g_refused.load()));
  log.last = now;
  log.unlogged = 0;
}

// Checks a hello against this rank's options and answers it. Returns the peer's
// rank once accepted; an error for a peer that does not match.
Result<int> AnswerHello(int fd, const wire::Hello& h, const TcpOptions& o, Deadline deadline,
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
  std::string reply = wire::EncodeReply({reason.empty(), reason});
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

// Accepts one connection from a higher rank on the listener `listen_fd` (at
// `listen_address`). Returns (-1, empty) for a connection that failed the
// handshake (refused and ignored); an error for a peer that does not match.
Result<std::pair<int, Fd>> AcceptOne(int listen_fd, const std::string& listen_address,
                                     const TcpOptions& o, Deadline deadline,
                                     const std::set<int>& waiting) {
  if (!WaitFor(listen_fd, POLLIN, deadline)) return WaitingTimeout(o, waiting);
  sockaddr_storage addr{};
  socklen_t addr_len = sizeof(addr);
  Fd fd(::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &addr_len,
                  SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (fd.get() < 0) return std::make_pair(-1, Fd());  // e.g. the client gave up already
  SetNoDelay(fd.get());
  ServerHandshake h(std::move(fd), RemoteName(addr, addr_len), o.key,
                    std::min(deadline, Clock::now() + TcpAcceptor::kHelloTimeout));
  Result<bool> done = h.Step();
  while (done.ok() && !*done) {
    done = WaitFor(h.fd(), h.events(), h.deadline()) ? h.Step() : Result<bool>(h.TimedOut());
  }
  if (!done.ok()) {
    NoteRefusal(nullptr, Describe(o.group_id, o.rank) + " (listening on " + listen_address + ")",
                h, done.status());
    return std::make_pair(-1, Fd());
  }
  ASSIGN_OR_RETURN(int from, AnswerHello(h.fd(), h.hello(), o, deadline, waiting));
  return std::make_pair(from, h.TakeFd());
}

// True while the peer has neither closed nor sent anything past its proof.
bool StillWaiting(int fd) {
  uint8_t byte;
  ssize_t r = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

uint64_t RefusedConnections() { return g_refused.load(); }

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

// ---- TcpTransport ----

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

struct TcpAcceptor::Pending {
  wire::Hello hello;
  Fd fd;
  Clock::time_point arrived;
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

// ---- TcpAcceptor ----

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
  std::vector<std::unique_ptr<ServerHandshake>> handshakes;
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{listener_->fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}});
    Deadline wake = Clock::now() + std::chrono::seconds(1);
    for (const auto& h : handshakes) {
      fds.push_back({h->fd(), h->events(), 0});
      wake = std::min(wake, h->deadline());
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
      ServerHandshake& h = *handshakes[i];
      Result<bool> done = rc > 0 && fds[i + 2].revents != 0 ? h.Step() : Result<bool>(false);
      if (done.ok() && !*done && now >= h.deadline()) done = h.TimedOut();
      if (!done.ok()) {
        NoteRefusal(&refused_, port, h, done.status());
        handshakes[i].reset();
      } else if (*done) {
        auto pending = std::make_unique<Pending>();
        pending->hello = h.hello();
        pending->fd = h.TakeFd();
        pending->arrived = now;
        handshakes[i].reset();
        MutexLock lock(mu_);
        pending_.emplace(pending->hello.group_id, std::move(pending));
        cv_.NotifyAll();
      }
    }
    std::erase(handshakes, nullptr);
    if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    Fd fd(::accept4(listener_->fd_, reinterpret_cast<sockaddr*>(&addr), &addr_len,
                    SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.get() < 0) continue;
    SetNoDelay(fd.get());
    auto h = std::make_unique<ServerHandshake>(std::move(fd), RemoteName(addr, addr_len), key_,
                                               Clock::now() + kHelloTimeout);
    if (handshakes.size() >= kMaxHandshakes) {
      NoteRefusal(&refused_, port, *h,
                  ResourceExhausted(std::to_string(kMaxHandshakes) +
                                    " other connections are in the middle of their handshake"));
      continue;
    }
    handshakes.push_back(std::move(h));  // its hello comes with the next poll
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
