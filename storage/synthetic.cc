#include "storage/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "api/half.h"

namespace tessera::storage {
namespace {

// splitmix64: fast, good enough for test data, same everywhere.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
};

}  // namespace

void FillSynthetic(DType dtype, int64_t n, uint64_t seed, void* out) {
  Rng rng{seed * 0x2545F4914F6CDD1DULL + 1};
  auto normal = [&rng](float* dst, int64_t count) {
    for (int64_t i = 0; i < count; i += 2) {  // Box-Muller: two values per pair of uniforms
      double u1 = rng.Uniform(), u2 = rng.Uniform();
      double r = std::sqrt(-2.0 * std::log(u1 + 1e-300)) * 0.02;
      dst[i] = static_cast<float>(r * std::cos(6.283185307179586 * u2));
      if (i + 1 < count) dst[i + 1] = static_cast<float>(r * std::sin(6.283185307179586 * u2));
    }
  };
  switch (dtype) {
    case DType::kFloat32:
      normal(static_cast<float*>(out), n);
      return;
    case DType::kFloat64: {
      auto* d = static_cast<double*>(out);
      for (int64_t i = 0; i < n; ++i) {
        float f;
        normal(&f, 1);
        d[i] = f;
      }
      return;
    }
    case DType::kBFloat16:
    case DType::kFloat16: {
      auto* d = static_cast<uint16_t*>(out);
      float buf[256];
      for (int64_t i = 0; i < n; i += 256) {
        int64_t m = std::min<int64_t>(256, n - i);
        normal(buf, m);
        for (int64_t j = 0; j < m; ++j) {
          d[i + j] = dtype == DType::kBFloat16 ? FloatToBFloat16(buf[j]) : FloatToHalf(buf[j]);
        }
      }
      return;
    }
    case DType::kBool: {
      auto* d = static_cast<uint8_t*>(out);
      for (int64_t i = 0; i < n; ++i) d[i] = rng.Next() & 1;
      return;
    }
    case DType::kInt32: {
      auto* d = static_cast<int32_t*>(out);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(rng.Next() % (1 << 21)) - (1 << 20);
      return;
    }
    case DType::kInt64: {
      auto* d = static_cast<int64_t*>(out);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int64_t>(rng.Next() % (1 << 21)) - (1 << 20);
      return;
    }
    default: {  // int8, uint8, int16: uniform bytes
      auto* d = static_cast<uint8_t*>(out);
      int64_t bytes = n * static_cast<int64_t>(DTypeSize(dtype));
      for (int64_t i = 0; i < bytes; ++i) d[i] = static_cast<uint8_t>(rng.Next());
      return;
    }
  }
}

std::string SyntheticBytes(DType dtype, int64_t n, uint64_t seed) {
  std::string s(n * DTypeSize(dtype), '\0');
  FillSynthetic(dtype, n, seed, s.data());
  return s;
}

}  // namespace tessera::storage
