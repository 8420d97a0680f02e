// The cryptography of the data port's handshake (see tcp_wire.h): the key every
// worker of a cluster derives from the cluster's bearer token, HMAC-SHA256 under
// it, random nonces and a constant-time comparison. OpenSSL underneath.
//
// The key is only as secret as the token: with an empty token (a cluster run
// without one) every worker derives the same well-known key, and the handshake
// then keeps out only peers that do not speak the protocol at all.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "api/status.h"

namespace tessera::collectives {

inline constexpr size_t kKeyBytes = 32;
inline constexpr size_t kMacBytes = 32;  // HMAC-SHA256
inline constexpr size_t kNonceBytes = 32;

using Mac = std::array<uint8_t, kMacBytes>;
using Nonce = std::array<uint8_t, kNonceBytes>;

// The secret the ranks of a group share. Value-initialized: all zeros, a key
// anyone knows (for tests and processes that trust every local user).
struct DataPortKey {
  std::array<uint8_t, kKeyBytes> bytes{};
};

// The label the data-port key is derived with (HKDF "info").
inline constexpr std::string_view kDataPortKeyInfo = "tessera data-port v1";

// HKDF-SHA256 of `token` (no salt, info kDataPortKeyInfo): the data-port key of
// a cluster whose bearer token is `token`. Deterministic, so every worker given
// the same token gets the same key. An empty token gives a key too (see above).
Result<DataPortKey> DeriveDataPortKey(std::string_view token);

// A fresh random key (RAND_bytes), for groups formed within one process tree.
Result<DataPortKey> RandomDataPortKey();

// HMAC-SHA256 under `key` of the concatenation of `parts`.
Result<Mac> HmacSha256(const DataPortKey& key,
                       std::span<const std::span<const uint8_t>> parts);

// Fills `out` from the operating system's random source (RAND_bytes).
Status RandomBytes(std::span<uint8_t> out);

// Equal sizes and bytes, in a time that depends only on the size (CRYPTO_memcmp).
bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace tessera::collectives
