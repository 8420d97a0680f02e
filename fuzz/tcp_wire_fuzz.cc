// The wire format of the collectives' TCP transport (collectives/transport/tcp/tcp_wire.h):
// what a worker's data port reads from anyone who connects to it, and what a
// connecting worker reads back.
//
// The input goes to every decoder whole, then through the sequences a reader
// meets on one connection (hello then proof; challenge then reply; frame headers
// with their payloads skipped). Properties checked:
//  - every failure is invalid_argument naming its field (details.field);
//  - a decoder that wants more asks for more bytes than it was given;
//  - a reader that feeds a decoder exactly the bytes it asks for gets what the
//    whole input gives;
//  - what decodes re-encodes to exactly the bytes it was decoded from.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "collectives/transport/tcp/tcp_wire.h"

namespace tessera::collectives {
namespace {

using fuzz::IsCleanError;
using wire::Bytes;

std::string Encode(const wire::Hello& v) { return wire::EncodeHello(v); }
std::string Encode(const wire::Challenge& v) { return wire::EncodeChallenge(v); }
std::string Encode(const wire::Proof& v) { return wire::EncodeProof(v); }
std::string Encode(const wire::Reply& v) { return wire::EncodeReply(v); }
std::string Encode(const wire::FrameHeader& v) { return wire::EncodeFrameHeader(v); }

// Decodes the start of `bytes` with `decode`, checks the properties above, and
// returns how many bytes the message took (0 when there is none).
template <typename T>
size_t Check(Result<wire::Decoded<T>> (*decode)(Bytes), Bytes bytes, const char* what) {
  const auto whole = decode(bytes);
  if (!whole.ok()) {
    FUZZ_CHECK(IsCleanError(whole.status(), {Code::kInvalidArgument}) &&
                   whole.status().details().contains("field"),
               std::string(what) + ": " + whole.status().ToString());
  } else if (!whole->value) {
    FUZZ_CHECK(whole->length > bytes.size(), std::string(what) + ": asks for no more bytes");
  } else {
    FUZZ_CHECK(whole->length <= bytes.size(), std::string(what) + ": longer than its input");
    const std::string again = Encode(*whole->value);
    const Bytes again_bytes = wire::AsBytes(again);
    FUZZ_CHECK(again.size() == whole->length &&
                   std::equal(again_bytes.begin(), again_bytes.end(), bytes.begin()),
               std::string(what) + ": does not re-encode to its bytes");
    const auto redecoded = decode(wire::AsBytes(again));
    FUZZ_CHECK(redecoded.ok() && redecoded->value && *redecoded->value == *whole->value &&
                   redecoded->length == again.size(),
               std::string(what) + ": round trip");
  }

  // A reader that reads exactly what the decoder asks for, starting from nothing.
  size_t have = 0;
  while (true) {
    const auto step = decode(bytes.first(have));
    if (!step.ok()) {
      FUZZ_CHECK(!whole.ok() && step.status().message() == whole.status().message(),
                 std::string(what) + ": a prefix fails (" + step.status().message() +
                     ") where the whole does not");
      break;
    }
    if (step->value) {
      FUZZ_CHECK(whole.ok() && whole->value && *step->value == *whole->value &&
                     step->length == whole->length,
                 std::string(what) + ": read piecewise, it decodes otherwise");
      break;
    }
    FUZZ_CHECK(step->length > have, std::string(what) + ": a prefix asks for no more bytes");
    if (step->length > bytes.size()) {
      FUZZ_CHECK(whole.ok() && !whole->value,
                 std::string(what) + ": the whole decodes, a reader waits");
      break;
    }
    have = step->length;
  }
  return whole.ok() && whole->value ? whole->length : 0;
}

}  // namespace
}  // namespace tessera::collectives

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::collectives;
  const wire::Bytes in(data, size);
  (void)wire::PeekMagic(in);
  Check(&wire::DecodeChallenge, in, "challenge");
  Check(&wire::DecodeReply, in, "reply");
  // A data port's side: a hello, then a proof.
  if (size_t n = Check(&wire::DecodeHello, in, "hello"); n > 0) {
    Check(&wire::DecodeProof, in.subspan(n), "proof after a hello");
  } else {
    Check(&wire::DecodeProof, in, "proof");
  }
  // A connecting side: a challenge, then the reply.
  if (auto c = wire::DecodeChallenge(in); c.ok() && c->value) {
    Check(&wire::DecodeReply, in.subspan(c->length), "reply after a challenge");
  }
  // A joined connection: frames, their payloads skipped.
  for (size_t at = 0; at < size;) {
    const size_t n = Check(&wire::DecodeFrameHeader, in.subspan(at), "frame header");
    if (n == 0) break;
    const auto header = wire::DecodeFrameHeader(in.subspan(at));
    at += n;
    at += static_cast<size_t>(std::min<uint64_t>(header->value->length, size - at));
  }
  return 0;
}
