// The wire format of TcpTransport (tcp_transport.h): encoders and decoders of
// every message, without I/O. Decoders accept any bytes and never crash; they
// say how many bytes they need for a valid beginning of a message (the magic
// alone first, so a stranger's bytes are found out after four of them), and
// fail for bytes that cannot begin one.
//
// Integers are u32 or u64 in the host's byte order (the mesh is homogeneous).
//
// Joining: rank i connects to every rank j < i (through j's data port or
// listener). Before a connection joins a group, each side proves that it knows
// the data-port key K (auth.h: derived from the cluster's token):
//
//   connector → acceptor  hello      "TSCH" | version 2 | from_rank | to_rank | size |
//                                    id_len | nonce_c (32 bytes) | group id (id_len bytes)
//   acceptor → connector  challenge  "TSCA" | nonce_s (32 bytes) | mac_a (32 bytes)
//   connector → acceptor  proof      "TSCP" | mac_c (32 bytes)
//   acceptor → connector  reply      "TSCH" | accepted (1 or 0) | reason_len | reason
//
// with H the hello's bytes as sent (nonce_c included) and
//   mac_a = HMAC-SHA256(K, "tessera data-port v2 accept"  | H | nonce_s)
//   mac_c = HMAC-SHA256(K, "tessera data-port v2 connect" | H | nonce_s)
// The connector checks mac_a before it proves anything itself, so a listener
// without K is found out; the acceptor hands the connection to its group only
// once mac_c is right. Both MACs cover the whole hello and both fresh nonces:
// a recorded exchange proves nothing on a new connection, nor for another
// group, rank or size, and the distinct labels keep one side's MAC from serving
// as the other's. The reply is the group's verdict (group id, size and ranks
// checked as before). An acceptor that gets a hello of another version answers
// with a refusing reply at once, which version 1 peers understand.
//
// This authenticates the peer when the connection is made. The frames that
// follow are neither encrypted nor authenticated: an attacker on the path who
// can inject into or take over TCP connections is not kept out.
//
// After joining, every message is a frame: "TSCF" | kind | length (u64) and
// `length` payload bytes. Kinds: data, goodbye (Close), abort (the error that
// poisoned the sender, as JSON).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "api/status.h"
#include "collectives/transport/tcp/auth.h"

namespace tessera::collectives::wire {

using Bytes = std::span<const uint8_t>;

inline constexpr uint32_t kHelloMagic = 0x48435354;      // "TSCH" (hello and reply)
inline constexpr uint32_t kChallengeMagic = 0x41435354;  // "TSCA"
inline constexpr uint32_t kProofMagic = 0x50435354;      // "TSCP"
inline constexpr uint32_t kFrameMagic = 0x46435354;      // "TSCF"
inline constexpr uint32_t kProtocolVersion = 2;

inline constexpr size_t kHelloHeadBytes = 24 + kNonceBytes;  // everything but the group id
inline constexpr size_t kChallengeBytes = 4 + kNonceBytes + kMacBytes;
inline constexpr size_t kProofBytes = 4 + kMacBytes;
inline constexpr size_t kReplyHeadBytes = 12;
inline constexpr size_t kFrameHeaderBytes = 16;

inline constexpr size_t kMaxGroupIdBytes = 4096;
inline constexpr size_t kMaxReasonBytes = 1 << 16;
// Larger frames can only come from a corrupt stream; refused before allocating.
inline constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 40;

// What a decoder made of the bytes at the start of a buffer: a whole message in
// `value`, `length` bytes long; or, without `value`, a valid beginning of one
// that needs `length` bytes in all (more than there are) to go on.
template <typename T>
struct Decoded {
  std::optional<T> value;
  size_t length = 0;
};

struct Hello {
  uint32_t from_rank = 0;
  uint32_t to_rank = 0;
  uint32_t size = 0;
  std::string group_id;
  Nonce nonce{};
  bool operator==(const Hello&) const = default;
};

struct Challenge {
  Nonce nonce{};
  Mac mac{};
  bool operator==(const Challenge&) const = default;
};

struct Proof {
  Mac mac{};
  bool operator==(const Proof&) const = default;
};

struct Reply {
  bool accepted = false;
  std::string reason;  // why not, when refused
  bool operator==(const Reply&) const = default;
};

enum class FrameKind : uint32_t { kData = 1, kGoodbye = 2, kAbort = 3 };

struct FrameHeader {
  FrameKind kind = FrameKind::kData;
  uint64_t length = 0;
  bool operator==(const FrameHeader&) const = default;
};

std::string EncodeHello(const Hello& hello);
std::string EncodeChallenge(const Challenge& challenge);
std::string EncodeProof(const Proof& proof);
std::string EncodeReply(const Reply& reply);
std::string EncodeFrameHeader(const FrameHeader& header);
// The same into `out`, without allocating (every frame sent has a header).
void EncodeFrameHeader(const FrameHeader& header, std::span<uint8_t, kFrameHeaderBytes> out);

// Errors are invalid_argument, with details.field naming the culprit ("magic",
// "version", "group_id", "accepted", "reason", "kind", "length"). A hello with
// the right magic but another version also has details.peer_version.
Result<Decoded<Hello>> DecodeHello(Bytes bytes);
Result<Decoded<Challenge>> DecodeChallenge(Bytes bytes);
Result<Decoded<Proof>> DecodeProof(Bytes bytes);
Result<Decoded<Reply>> DecodeReply(Bytes bytes);
Result<Decoded<FrameHeader>> DecodeFrameHeader(Bytes bytes);

// The first four bytes as a u32 (a message's magic); nullopt for fewer.
std::optional<uint32_t> PeekMagic(Bytes bytes);

// mac_a (acceptor) or mac_c (connector) of the exchange that began with the
// hello `hello` (its bytes as sent) and went on with the challenge's nonce.
enum class Side { kAcceptor, kConnector };
Result<Mac> HandshakeMac(const DataPortKey& key, Side side, Bytes hello, const Nonce& nonce_s);

inline Bytes AsBytes(const std::string& s) {
  return Bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace tessera::collectives::wire
