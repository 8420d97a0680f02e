// Element-wise reductions, per dtype.
//
// Partial results travel and combine in the dtype's *accumulation dtype*:
// float32 for float16 and bfloat16 (rounded once, at the end), the dtype itself
// otherwise. Semantics per dtype:
//   floats   sum/prod/min/max as IEEE; min and max propagate NaN.
//   integers sum and prod wrap around (two's complement), like NumPy.
//   bool     sum and max are logical or, prod and min logical and (outputs 0/1).
//   mean     the sum divided by the number of contributions; integers truncate
//            toward zero (after a sum that may have wrapped); undefined for bool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api/collective_ops.h"
#include "api/dtype.h"
#include "api/status.h"

namespace tessera::collectives {

using ::tessera::ReduceOp;
using ::tessera::ReduceOpName;
// float32 for float16/bfloat16, else `dtype`.
DType AccumDType(DType dtype);
// invalid_argument when `op` is not defined on `dtype` (mean on bool).
Status CheckReducible(DType dtype, ReduceOp op);

// out[i] = a[i] ⊕ b[i] over `count` elements of accumulation dtype `dtype`, in
// that operand order (so NaN payloads and ±0 come out the same everywhere).
// kMean combines as kSum. `out` may alias `a` or `b`.
void ReduceElements(ReduceOp op, DType dtype, const uint8_t* a, const uint8_t* b, uint8_t* out,
                    size_t count);
// data[i] /= divisor, for the mean; floats divide, integers truncate.
void DivideElements(DType dtype, uint8_t* data, size_t count, int64_t divisor);

// `count` elements of `dtype` to AccumDType(dtype) and back. Identity copies when
// the two are the same; `in` and `out` must not overlap.
void ToAccum(DType dtype, const uint8_t* in, size_t count, uint8_t* out);
void FromAccum(DType dtype, const uint8_t* in, size_t count, uint8_t* out);

struct NonFinite {
  int64_t nan = 0;
  int64_t inf = 0;
  int64_t first_index = -1;
  bool any() const { return nan + inf > 0; }
};
// NaN and infinity counts of `count` elements of `dtype` (always none for integers).
NonFinite CountNonFinite(DType dtype, const uint8_t* data, size_t count);

}  // namespace tessera::collectives
