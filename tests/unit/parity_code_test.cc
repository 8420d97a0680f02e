// The memory tier's erasure code (worker/parity_code.h): where each member's symbols
// sit in a group's codewords, that parity row 0 is XOR, that any k symbols of a
// codeword give back every stripe, and that the GF(2^8) arithmetic agrees with a
// byte-at-a-time reference over lengths around ISA-L's 64-byte blocks.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "worker/parity_code.h"

namespace tessera::worker {
namespace {

// GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), one bit at a time.
uint8_t Mul(uint8_t a, uint8_t b) {
  uint8_t r = 0;
  while (b) {
    if (b & 1) r ^= a;
    a = static_cast<uint8_t>((a << 1) ^ ((a & 0x80) ? 0x1d : 0));
    b >>= 1;
  }
  return r;
}

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

TEST(ParityGeometry, EveryCodewordHasOneSymbolPerMemberAndEveryStripeIsInOne) {
  for (int m = 2; m <= 8; ++m) {
    for (int p = 1; p <= ParityCode::kMaxParity && p < m; ++p) {
      const int k = m - p;
      std::vector<std::set<int>> stripes_of(m), rows_of(m);
      for (int r = 0; r < m; ++r) {
        std::set<int> symbols;
        for (int i = 0; i < m; ++i) {
          const int s = SymbolOf(r, i, m, p);
          ASSERT_TRUE(symbols.insert(s).second) << "m=" << m << " p=" << p << " r=" << r;
          if (s < k) {
            EXPECT_TRUE(stripes_of[i].insert(s).second);
          } else {
            EXPECT_EQ(ParityHolder(r, s - k, m), i);
            rows_of[i].insert(r);
          }
        }
        EXPECT_EQ(*symbols.rbegin(), m - 1);  // 0..k-1 stripes, k..m-1 parity rows
      }
      for (int i = 0; i < m; ++i) {
        EXPECT_EQ(static_cast<int>(stripes_of[i].size()), k);  // each stripe of its share once
        EXPECT_EQ(static_cast<int>(rows_of[i].size()), p);     // p parity rows to hold
      }
    }
  }
  EXPECT_EQ(StripeLength(10, 3), 4u);
  EXPECT_EQ(StripeLength(9, 3), 3u);
  EXPECT_EQ(StripeLength(9, 1), 9u);
}

TEST(ParityCode, MulAddAgreesWithTheReferenceAroundBlockEdges) {
  for (uint64_t n : {1u, 63u, 64u, 65u, 127u, 128u, 1000u, 4099u}) {
    for (int coef : {0, 1, 2, 0x53, 0xff}) {
      const auto src = Random(n, static_cast<uint32_t>(n * 7 + coef));
      auto dst = Random(n, static_cast<uint32_t>(n * 11 + coef));
      auto want = dst;
      for (uint64_t i = 0; i < n; ++i) want[i] ^= Mul(static_cast<uint8_t>(coef), src[i]);
      MulAdd(static_cast<uint8_t>(coef), src.data(), dst.data(), n);
      EXPECT_EQ(dst, want) << "n=" << n << " coef=" << coef;
    }
  }
}

TEST(ParityCode, RowZeroIsXorAndAnyKSymbolsGiveBackEveryStripe) {
  constexpr uint64_t n = 200;
  for (int k = 1; k <= 7; ++k) {
    for (int p = 1; p <= ParityCode::kMaxParity; ++p) {
      const ParityCode code(k, p);
      for (int d = 0; d < k; ++d) EXPECT_EQ(code.Coefficient(0, d), 1);
      // symbols: k stripes, then p parity rows
      std::vector<std::vector<uint8_t>> sym;
      for (int d = 0; d < k; ++d) sym.push_back(Random(n, static_cast<uint32_t>(k * 100 + p * 10 + d)));
      for (int q = 0; q < p; ++q) {
        std::vector<uint8_t> row(n, 0);
        for (int d = 0; d < k; ++d) MulAdd(code.Coefficient(q, d), sym[d].data(), row.data(), n);
        sym.push_back(row);
      }
      // Every choice of k symbols of the k + p.
      for (uint32_t mask = 0; mask < (1u << (k + p)); ++mask) {
        if (__builtin_popcount(mask) != k) continue;
        std::vector<int> have;
        for (int s = 0; s < k + p; ++s) {
          if (mask & (1u << s)) have.push_back(s);
        }
        for (int want = 0; want < k; ++want) {
          auto coef = code.Decoder(have, want);
          ASSERT_TRUE(coef.ok()) << coef.status().ToString();
          std::vector<uint8_t> got(n, 0);
          for (int j = 0; j < k; ++j) MulAdd((*coef)[j], sym[have[j]].data(), got.data(), n);
          ASSERT_EQ(got, sym[want]) << "k=" << k << " p=" << p << " mask=" << mask << " want=" << want;
        }
      }
    }
  }
  EXPECT_FALSE(ParityCode(3, 2).Decoder({0, 1}, 2).ok());  // too few symbols
}

}  // namespace
}  // namespace tessera::worker
