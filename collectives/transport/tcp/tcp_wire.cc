#include "collectives/transport/tcp/tcp_wire.h"

#include <cstdio>
#include <cstring>
#include <string_view>

namespace tessera::collectives::wire {
namespace {

constexpr std::string_view kAcceptLabel = "tessera data-port v2 accept";
constexpr std::string_view kConnectLabel = "tessera data-port v2 connect";

void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
template <size_t N>
void PutArray(std::string& out, const std::array<uint8_t, N>& a) {
  out.append(reinterpret_cast<const char*>(a.data()), N);
}

// REQUIRES: bytes.size() >= offset + 4 (resp. 8, N).
uint32_t GetU32(Bytes bytes, size_t offset) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}
uint64_t GetU64(Bytes bytes, size_t offset) {
  uint64_t v;
  std::memcpy(&v, bytes.data() + offset, 8);
  return v;
}
template <size_t N>
std::array<uint8_t, N> GetArray(Bytes bytes, size_t offset) {
  std::array<uint8_t, N> a;
  std::memcpy(a.data(), bytes.data() + offset, N);
  return a;
}

template <typename T>
Decoded<T> NeedMore(size_t length) {
  return Decoded<T>{std::nullopt, length};
}

// An error unless the message begins with `magic`. REQUIRES: bytes.size() >= 4.
// (Every decoder asks for the magic alone first, so that a reader finds out
// about a stranger's bytes as soon as four of them are there.)
Status CheckMagic(Bytes bytes, uint32_t magic, const char* what) {
  if (GetU32(bytes, 0) != magic) {
    char hex[11];
    std::snprintf(hex, sizeof(hex), "0x%08x", GetU32(bytes, 0));
    return InvalidArgument(std::string("not a ") + what + " (it begins with " + hex + ")",
                           {{"field", "magic"}});
  }
  return Status::Ok();
}

}  // namespace

std::string EncodeHello(const Hello& h) {
  std::string out;
  out.reserve(kHelloHeadBytes + h.group_id.size());
  PutU32(out, kHelloMagic);
  PutU32(out, kProtocolVersion);
  PutU32(out, h.from_rank);
  PutU32(out, h.to_rank);
  PutU32(out, h.size);
  PutU32(out, static_cast<uint32_t>(h.group_id.size()));
  PutArray(out, h.nonce);
  return out + h.group_id;
}

std::string EncodeChallenge(const Challenge& c) {
  std::string out;
  PutU32(out, kChallengeMagic);
  PutArray(out, c.nonce);
  PutArray(out, c.mac);
  return out;
}

std::string EncodeProof(const Proof& p) {
  std::string out;
  PutU32(out, kProofMagic);
  PutArray(out, p.mac);
  return out;
}

std::string EncodeReply(const Reply& r) {
  std::string out;
  PutU32(out, kHelloMagic);
  PutU32(out, r.accepted ? 1 : 0);
  PutU32(out, static_cast<uint32_t>(r.reason.size()));
  return out + r.reason;
}

void EncodeFrameHeader(const FrameHeader& h, std::span<uint8_t, kFrameHeaderBytes> out) {
  const uint32_t magic = kFrameMagic;
  const uint32_t kind = static_cast<uint32_t>(h.kind);
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &kind, 4);
  std::memcpy(out.data() + 8, &h.length, 8);
}

std::string EncodeFrameHeader(const FrameHeader& h) {
  std::string out(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(h, std::span<uint8_t, kFrameHeaderBytes>(
                           reinterpret_cast<uint8_t*>(out.data()), kFrameHeaderBytes));
  return out;
}

Result<Decoded<Hello>> DecodeHello(Bytes bytes) {
  if (bytes.size() < 4) return NeedMore<Hello>(4);
  RETURN_IF_ERROR(CheckMagic(bytes, kHelloMagic, "Tessera collectives hello"));
  // The version comes first so that a peer of another version hears why at once,
  // whatever the length of its hello.
  if (bytes.size() < 8) return NeedMore<Hello>(8);
  const uint32_t version = GetU32(bytes, 4);
  if (version != kProtocolVersion) {
    return InvalidArgument("collectives protocol version " + std::to_string(version) +
                               ", this data port speaks version " +
                               std::to_string(kProtocolVersion),
                           {{"field", "version"}, {"peer_version", version}});
  }
  if (bytes.size() < kHelloHeadBytes) return NeedMore<Hello>(kHelloHeadBytes);
  const uint32_t id_len = GetU32(bytes, 20);
  if (id_len > kMaxGroupIdBytes) {
    return InvalidArgument("hello with a group id of " + std::to_string(id_len) +
                               " bytes (at most " + std::to_string(kMaxGroupIdBytes) + ")",
                           {{"field", "group_id"}});
  }
  const size_t length = kHelloHeadBytes + id_len;
  if (bytes.size() < length) return NeedMore<Hello>(length);
  Hello h;
  h.from_rank = GetU32(bytes, 8);
  h.to_rank = GetU32(bytes, 12);
  h.size = GetU32(bytes, 16);
  h.nonce = GetArray<kNonceBytes>(bytes, 24);
  h.group_id.assign(reinterpret_cast<const char*>(bytes.data()) + kHelloHeadBytes, id_len);
  return Decoded<Hello>{std::move(h), length};
}

Result<Decoded<Challenge>> DecodeChallenge(Bytes bytes) {
  if (bytes.size() < 4) return NeedMore<Challenge>(4);
  RETURN_IF_ERROR(CheckMagic(bytes, kChallengeMagic, "data-port challenge"));
  if (bytes.size() < kChallengeBytes) return NeedMore<Challenge>(kChallengeBytes);
  Challenge c;
  c.nonce = GetArray<kNonceBytes>(bytes, 4);
  c.mac = GetArray<kMacBytes>(bytes, 4 + kNonceBytes);
  return Decoded<Challenge>{c, kChallengeBytes};
}

Result<Decoded<Proof>> DecodeProof(Bytes bytes) {
  if (bytes.size() < 4) return NeedMore<Proof>(4);
  RETURN_IF_ERROR(CheckMagic(bytes, kProofMagic, "data-port proof"));
  if (bytes.size() < kProofBytes) return NeedMore<Proof>(kProofBytes);
  Proof p;
  p.mac = GetArray<kMacBytes>(bytes, 4);
  return Decoded<Proof>{p, kProofBytes};
}

Result<Decoded<Reply>> DecodeReply(Bytes bytes) {
  if (bytes.size() < 4) return NeedMore<Reply>(4);
  RETURN_IF_ERROR(CheckMagic(bytes, kHelloMagic, "hello reply"));
  if (bytes.size() < kReplyHeadBytes) return NeedMore<Reply>(kReplyHeadBytes);
  const uint32_t accepted = GetU32(bytes, 4);
  if (accepted > 1) {
    return InvalidArgument("hello reply with verdict " + std::to_string(accepted),
                           {{"field", "accepted"}});
  }
  const uint32_t reason_len = GetU32(bytes, 8);
  if (reason_len > kMaxReasonBytes) {
    return InvalidArgument("hello reply with a reason of " + std::to_string(reason_len) +
                               " bytes",
                           {{"field", "reason"}});
  }
  const size_t length = kReplyHeadBytes + reason_len;
  if (bytes.size() < length) return NeedMore<Reply>(length);
  Reply r;
  r.accepted = accepted == 1;
  r.reason.assign(reinterpret_cast<const char*>(bytes.data()) + kReplyHeadBytes, reason_len);
  return Decoded<Reply>{std::move(r), length};
}

Result<Decoded<FrameHeader>> DecodeFrameHeader(Bytes bytes) {
  if (bytes.size() < 4) return NeedMore<FrameHeader>(4);
  RETURN_IF_ERROR(CheckMagic(bytes, kFrameMagic, "frame"));
  if (bytes.size() < kFrameHeaderBytes) return NeedMore<FrameHeader>(kFrameHeaderBytes);
  const uint32_t kind = GetU32(bytes, 4);
  const uint64_t length = GetU64(bytes, 8);
  if (kind < 1 || kind > 3) {
    return InvalidArgument("frame of kind " + std::to_string(kind), {{"field", "kind"}});
  }
  if (length > kMaxFrameBytes) {
    return InvalidArgument("frame of " + std::to_string(length) + " bytes", {{"field", "length"}});
  }
  return Decoded<FrameHeader>{FrameHeader{static_cast<FrameKind>(kind), length},
                              kFrameHeaderBytes};
}

std::optional<uint32_t> PeekMagic(Bytes bytes) {
  if (bytes.size() < 4) return std::nullopt;
  return GetU32(bytes, 0);
}

Result<Mac> HandshakeMac(const DataPortKey& key, Side side, Bytes hello, const Nonce& nonce_s) {
  const std::string_view label = side == Side::kAcceptor ? kAcceptLabel : kConnectLabel;
  const Bytes parts[] = {
      Bytes(reinterpret_cast<const uint8_t*>(label.data()), label.size()), hello,
      Bytes(nonce_s.data(), nonce_s.size())};
  return HmacSha256(key, parts);
}

}  // namespace tessera::collectives::wire
