// Deterministic synthetic tensor data for the demo, tests and benchmarks (not a test
// double: `tessera demo` saves it as its model):
// weights like a trained model's (normal × 0.02), in any dtype.
#pragma once

#include <cstdint>
#include <string>

#include "api/dtype.h"

namespace tessera::storage {

// Fills `n` elements of `dtype` at `out` from `seed`: floats ~ N(0, 0.02)
// (bfloat16 / float16 are that value rounded), ints uniform in their range
// (int32/int64 in ±2^20), bools 0/1.
void FillSynthetic(DType dtype, int64_t n, uint64_t seed, void* out);
std::string SyntheticBytes(DType dtype, int64_t n, uint64_t seed);

}  // namespace tessera::storage
