#include "collectives/transport/tcp/tcp_handshake.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "api/thread_annotations.h"

namespace tessera::collectives {
namespace tcp {
namespace {

constexpr std::chrono::milliseconds kRetryDelay{20};
constexpr const char* kDroppedUnanswered = "dropped_unanswered";

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
  // The peer's data port holds the hello until that rank joins the group: a deadline
  // passed on the way means it never did.
  auto missing = [&](const Status& st) {
    if (st.code() != Code::kDeadlineExceeded) return st;
    return DeadlineExceeded(self + ": " + st.message() + " (rank " + std::to_string(peer) +
                                " did not join the group in time)",
                            {{"peer_rank", peer}, {"missing_ranks", nlohmann::json::array({peer})}});
  };
  if (Status st = ReadFull(fd, first.data(), first.size(), deadline, what); !st.ok()) {
    if (st.code() != Code::kUnavailable) return missing(st);
    // Dropped unanswered: a data port flooded by strangers makes room that way
    // (handshake_table.h), so ConnectTo tries again.
    return Unavailable(self + ": " + st.message() + " before answering the hello",
                       {{"peer_rank", peer}, {kDroppedUnanswered, true}});
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
  auto read = ReadMessage(fd, &wire::DecodeReply, std::move(first), deadline, what);
  if (!read.ok()) return missing(read.status());
  const wire::Reply& reply = *read;
  if (!reply.accepted) {
    return InvalidArgument(self + ": " + them + " refused the connection: " + reply.reason,
                           {{"peer_rank", peer}});
  }
  return Status::Ok();
}

// Every refusal of the process: counted, and logged to stderr at most once a
// second (the lines a flood would add are counted and summed up instead).
std::atomic<uint64_t> g_refused{0};
std::atomic<uint64_t> g_connect_retries{0};
std::atomic<uint64_t> g_refusal_lines{0};  // lines the refusal log wrote

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

}  // namespace

std::string Describe(const std::string& group_id, int rank) {
  return "rank " + std::to_string(rank) + " of group '" + group_id + "'";
}

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
      Status st = ClientHandshake(fd.get(), peer, address, o, deadline);
      if (st.ok()) return fd;
      const auto& d = st.details();
      if (!d.is_object() || !d.value(kDroppedUnanswered, false)) return st;
      last_error = "it closed the connection before answering the hello: a data port of another "
                   "version, or one flooded with connections";
    }
    if (Clock::now() + kRetryDelay >= deadline) {
      return DeadlineExceeded(self + ": cannot connect to rank " + std::to_string(peer) + " at " +
                                  address + " (" + last_error + ") within " +
                                  std::to_string(o.connect_timeout.count()) + " ms",
                              {{"missing_ranks", {peer}}});
    }
    g_connect_retries.fetch_add(1);
    std::this_thread::sleep_for(kRetryDelay);  // the peer may not listen yet
  }
}

void NoteRefusal(std::atomic<uint64_t>* counter, const std::string& port,
                 const ServerHandshake& h, const Status& why) {
  // The process-wide count first: whoever sees this port's count go up then
  // sees the total include it.
  const uint64_t total = g_refused.fetch_add(1) + 1;
  if (counter != nullptr) counter->fetch_add(1);
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
  g_refusal_lines.fetch_add(1);
}

void FlushRefusalLog(const std::string& port) {
  RefusalLog& log = TheRefusalLog();
  MutexLock lock(log.mu);
  const auto now = Clock::now();
  if (log.unlogged == 0 || now - log.last < kRefusalLogInterval) return;
  std::fprintf(stderr, "%s: %s (%llu refused in all)\n", port.c_str(),
               Unlogged(log.unlogged).c_str(), static_cast<unsigned long long>(g_refused.load()));
  log.last = now;
  log.unlogged = 0;
  g_refusal_lines.fetch_add(1);
}

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

}  // namespace tcp

uint64_t RefusedConnections() { return tcp::g_refused.load(); }
uint64_t ConnectRetries() { return tcp::g_connect_retries.load(); }

namespace tcp {

uint64_t RefusalLogLines() { return g_refusal_lines.load(); }

bool RefusalLogIdle() {
  RefusalLog& log = TheRefusalLog();
  MutexLock lock(log.mu);
  return log.unlogged == 0 &&
         (log.last == Clock::time_point{} || Clock::now() - log.last >= kRefusalLogInterval);
}

}  // namespace tcp

}  // namespace tessera::collectives
