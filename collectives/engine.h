// Internal to the collectives library: steps that several ops share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "collectives/call.h"
#include "collectives/options.h"
#include "collectives/reduce.h"
#include "collectives/tensor.h"

namespace tessera::collectives {

// All-reduces `count` elements of accumulation dtype `dtype` in place: picks the
// algorithm, runs the call's Exchange (carrying the data when direct) and the
// data phase. `op` kMean sums; FinishReduce divides.
Status AllReduceAccum(Call& call, ReduceOp op, DType dtype, uint8_t* data, size_t count,
                      const Options& options);

// The tail of every reduction: divides for the mean, converts `accum` (modified)
// to `dtype` into `out` (which may be `accum` when no conversion is needed) and,
// if asked, reports NaN/Inf in `out` as invalid_argument naming `what`.
Status FinishReduce(ReduceOp op, DType dtype, uint8_t* accum, size_t count, int64_t contributions,
                    bool check_inf_nan, uint8_t* out, const std::string& what);

// The all-gather step of AllGather and SparseAllReduce, as call `op` of `session`.
Status GatherTensor(Session& session, const Tensor& input, Tensor& output, bool tiled,
                    const Options& options, std::string_view op);

}  // namespace tessera::collectives
