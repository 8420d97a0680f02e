// The handshake of a data-port connection (tcp_wire.h has its bytes), internal to
// collectives/transport/tcp/: the connecting side (ConnectTo), the accepting side
// (ServerHandshake, driven by socket readiness so one thread runs many), the checks of a
// hello against a group (AnswerHello), and the log and count of refused strangers.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "api/status.h"
#include "collectives/transport/tcp/auth.h"
#include "collectives/transport/tcp/tcp_listener.h"
#include "collectives/transport/tcp/tcp_socket.h"
#include "collectives/transport/tcp/tcp_wire.h"

namespace tessera::collectives {

// A connection that proved it knows the key, waiting in a TcpAcceptor for the
// Connect of the group its hello names.
struct TcpAcceptor::Pending {
  wire::Hello hello;
  tcp::Fd fd;
  Clock::time_point arrived;
};

namespace tcp {

std::string Describe(const std::string& group_id, int rank);

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

// Connects to rank `peer` at `address` and has the hello accepted.
Result<Fd> ConnectTo(int peer, const std::string& address, const TcpOptions& o, Deadline deadline);

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
  // Brings the deadline to at most `limit` after the connection arrived.
  void Tighten(std::chrono::milliseconds limit) { deadline_ = std::min(deadline_, started_ + limit); }
  // True until the peer sent its first byte.
  bool Silent() const { return stage_ == Stage::kHello && in_.empty(); }
  const std::string& remote() const { return remote_; }
  // The remote address without its port.
  std::string source() const { return remote_.substr(0, remote_.rfind(':')); }
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

// Counts a refused connection (in `counter`, if given, and in RefusedConnections) and
// logs it, naming `port`, the peer and what it claimed, at most once a second.
void NoteRefusal(std::atomic<uint64_t>* counter, const std::string& port,
                 const ServerHandshake& h, const Status& why);

// Logs the refusals a flood kept from the log, once their second is over.
void FlushRefusalLog(const std::string& port);

// Lines the refusal log has written in this process; and whether the next
// refusal would be logged at once (nothing held back, its second over).
uint64_t RefusalLogLines();
bool RefusalLogIdle();

// Checks a hello against this rank's options and answers it. Returns the peer's
// rank once accepted; an error for a peer that does not match.
Result<int> AnswerHello(int fd, const wire::Hello& h, const TcpOptions& o, Deadline deadline,
                        const std::set<int>& waiting);

// deadline_exceeded naming the ranks of `waiting` that never connected.
Status WaitingTimeout(const TcpOptions& o, const std::set<int>& waiting);

// Accepts one connection from a higher rank on the listener `listen_fd` (at
// `listen_address`). Returns (-1, empty) for a connection that failed the
// handshake (refused and ignored); an error for a peer that does not match.
Result<std::pair<int, Fd>> AcceptOne(int listen_fd, const std::string& listen_address,
                                     const TcpOptions& o, Deadline deadline,
                                     const std::set<int>& waiting);

}  // namespace tcp
}  // namespace tessera::collectives
