#include "worker/parity_code.h"

#include <isa-l/erasure_code.h>

#include <cstring>
#include <string>

namespace tessera::worker {

ParityCode::ParityCode(int k, int p) : k_(k), p_(p), c_(static_cast<size_t>(k * p)) {
  // ISA-L's Cauchy generator: k identity rows, then p rows 1 / (i ^ j). Every square
  // submatrix of a Cauchy matrix is invertible, and scaling its columns keeps that:
  // column d is divided by its first row's entry, so row 0 becomes all ones (XOR).
  std::vector<uint8_t> g(static_cast<size_t>((k + p) * k));
  gf_gen_cauchy1_matrix(g.data(), k + p, k);
  for (int d = 0; d < k; ++d) {
    const uint8_t scale = gf_inv(g[static_cast<size_t>(k * k + d)]);
    for (int q = 0; q < p; ++q) {
      c_[static_cast<size_t>(q * k + d)] = gf_mul(g[static_cast<size_t>((k + q) * k + d)], scale);
    }
  }
}

Result<std::vector<uint8_t>> ParityCode::Decoder(const std::vector<int>& have, int want) const {
  if (static_cast<int>(have.size()) != k_ || want < 0 || want >= k_) {
    return Internal("a parity decode takes " + std::to_string(k_) + " symbols for a stripe 0.." +
                    std::to_string(k_ - 1) + ", not " + std::to_string(have.size()) + " for " +
                    std::to_string(want));
  }
  // The generator's rows of the symbols held, inverted: row `want` of the inverse
  // gives stripe `want` from them.
  std::vector<uint8_t> a(static_cast<size_t>(k_ * k_), 0), inv(a.size());
  for (int row = 0; row < k_; ++row) {
    const int s = have[row];
    for (int d = 0; d < k_; ++d) {
      a[static_cast<size_t>(row * k_ + d)] = s < k_ ? (s == d ? 1 : 0) : Coefficient(s - k_, d);
    }
  }
  if (gf_invert_matrix(a.data(), inv.data(), k_) != 0) {
    return Internal("the parity symbols held do not determine stripe " + std::to_string(want));
  }
  return std::vector<uint8_t>(inv.begin() + want * k_, inv.begin() + (want + 1) * k_);
}

void MulAdd(uint8_t coef, const uint8_t* src, uint8_t* dst, uint64_t n) {
  if (coef == 0 || n == 0) return;
  uint64_t i = 0;
  if (coef == 1) {
    for (; i + 8 <= n; i += 8) {
      uint64_t a, b;
      std::memcpy(&a, dst + i, 8);
      std::memcpy(&b, src + i, 8);
      a ^= b;
      std::memcpy(dst + i, &a, 8);
    }
    for (; i < n; ++i) dst[i] ^= src[i];
    return;
  }
  // ISA-L's vector kernel over whole 64-byte blocks (its minimum), bytes after them
  // one by one.
  unsigned char table[32];
  gf_vect_mul_init(coef, table);
  constexpr uint64_t kBlock = 64;
  constexpr uint64_t kMaxRun = uint64_t{1} << 30;  // gf_vect_mad takes an int length
  for (; i + kBlock <= n;) {
    const uint64_t run = std::min((n - i) / kBlock * kBlock, kMaxRun);
    gf_vect_mad(static_cast<int>(run), 1, 0, table, const_cast<uint8_t*>(src + i), dst + i);
    i += run;
  }
  for (; i < n; ++i) dst[i] ^= gf_mul(coef, src[i]);
}

}  // namespace tessera::worker
