// Non-cryptographic hashes that are equal in every process: fingerprints of
// collective signatures and the value digests of assert_equal.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace tessera::collectives {

inline uint64_t Mix64(uint64_t x) {  // the murmur3 finalizer
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// 128 bits over `bytes`, 8 bytes per step in two independently seeded lanes; the
// length is mixed in so that trailing zero bytes still change the digest.
inline std::array<uint64_t, 2> HashBytes(std::span<const uint8_t> bytes) {
  uint64_t h0 = 0x9e3779b97f4a7c15ULL, h1 = 0x632be59bd9b4e019ULL;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h0 = (h0 ^ Mix64(w)) * 0x100000001b3ULL;
    h1 = ((h1 << 31) | (h1 >> 33)) ^ (w * 0x87c37b91114253d5ULL);
  }
  uint64_t tail = 0;
  if (i < bytes.size()) std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  h0 = Mix64(h0 ^ Mix64(tail) ^ bytes.size());
  h1 = Mix64(h1 ^ tail ^ Mix64(bytes.size()));
  return {h0, h1};
}

inline uint64_t HashString(std::string_view s) {
  return HashBytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()})[0];
}

}  // namespace tessera::collectives
