// The erasure code of a memory checkpoint's parity groups (docs/memory-tier.md,
// "Parity"). A group of m workers survives the loss of any p of them: each share is
// cut into k = m - p stripes, and the group forms m codewords of m symbols, one symbol
// per member. In codeword r, members r, r-1, ..., r-p+1 (mod m) hold its p parity
// symbols and every other member one stripe of its own share. Parity row 0 is the
// XOR of the codeword's stripes, so p = 1 is plain XOR parity; rows 1.. are
// Reed–Solomon rows (a Cauchy matrix over GF(2^8), which makes any k symbols of a
// codeword enough to rebuild the others). The arithmetic is ISA-L's. Pure.
#pragma once

#include <cstdint>
#include <vector>

#include "api/status.h"

namespace tessera::worker {

class ParityCode {
 public:
  static constexpr int kMaxParity = 3;
  // k stripes and p parity symbols per codeword: k >= 1, 1 <= p <= kMaxParity.
  ParityCode(int k, int p);
  int k() const { return k_; }
  int p() const { return p_; }
  // The coefficient of stripe d in parity symbol q (1 for every stripe in row 0).
  uint8_t Coefficient(int q, int d) const { return c_[static_cast<size_t>(q * k_ + d)]; }
  // The coefficients that give stripe `want` from the k symbols `have`, in have's
  // order: each a stripe d (0..k-1) or a parity row q (as k + q).
  Result<std::vector<uint8_t>> Decoder(const std::vector<int>& have, int want) const;

 private:
  int k_, p_;
  std::vector<uint8_t> c_;  // p rows of k
};

// Member `i`'s symbol in codeword `r` of a group of m with p parity: a stripe d of its
// share (0..m-p-1), or k + q for parity row q of that codeword (as Decoder takes it).
inline int SymbolOf(int r, int i, int m, int p) {
  const int offset = ((r - i) % m + m) % m;
  return offset >= p ? offset - p : (m - p) + offset;
}
// The member holding parity row q of codeword r.
inline int ParityHolder(int r, int q, int m) { return ((r - q) % m + m) % m; }
// The length of each stripe for shares of at most `longest` bytes, k stripes a share.
inline uint64_t StripeLength(uint64_t longest, int k) {
  return k <= 1 ? longest : (longest + static_cast<uint64_t>(k) - 1) / static_cast<uint64_t>(k);
}

// dst ^= coef · src over n bytes, in GF(2^8) (coef 1: XOR).
void MulAdd(uint8_t coef, const uint8_t* src, uint8_t* dst, uint64_t n);

}  // namespace tessera::worker
