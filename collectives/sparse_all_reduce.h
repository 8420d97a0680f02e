// All-reduce (sum) of indexed slices: the sparse gradient of an embedding, as
// rows `indices` of a dense tensor of `dense_shape` (TF IndexedSlices).
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/collectives.h"

namespace tessera::collectives {

struct IndexedSlices {
  Tensor values;                 // [k, d1, ...]: row i belongs at dense row indices[i]
  std::vector<int64_t> indices;  // k entries in [0, dense_shape[0]); repeats add up
  Shape dense_shape;             // [N, d1, ...]
};

enum class SparsePath {
  // Gather every rank's row count first: if all are equal, kGather, else kDense.
  kAuto,
  // All-gather values and indices: the result is their concatenation in rank order.
  kGather,
  // Densify locally, all-reduce the dense tensor: the result has every row, in order.
  kDense,
};

struct SparseAllReduceOptions : Options {
  SparsePath path = SparsePath::kAuto;
  // Set by a caller that found this rank's input malformed before the call
  // (e.g. one of several local shares): the rank still joins, so that every rank
  // fails at once naming it rather than waiting for its timeout.
  Status input_error;
  // The dense path's tensor (in the accumulation dtype) may hold at most this
  // many bytes; a call that would need more fails on every rank (resource_exhausted).
  uint64_t max_dense_bytes = uint64_t{4} << 30;
};

// The path a call took: "gather" or "dense".
const char* SparsePathName(SparsePath path);

// Sums `slices` over the group. Both paths give the same Densify(result) (bit
// for bit for integers and exactly representable sums). Every rank passes the
// same dtype and dense_shape (a conflict naming the ranks otherwise); row counts
// may differ. A malformed input on any rank (indices out of range, as many
// indices as value rows, values that are not rows of dense_shape) fails the call
// on every rank with invalid_argument naming the rank (details.invalid_ranks,
// .field) and leaves the group usable. `path_taken`, if given, gets kGather or
// kDense.
Result<IndexedSlices> SparseAllReduce(Group& group, const IndexedSlices& slices,
                                      const SparseAllReduceOptions& options = {},
                                      SparsePath* path_taken = nullptr);

// invalid_argument naming the field (values, indices, dense_shape) unless
// `slices` are rows of a tensor of dense_shape with every index in range.
Status CheckSlices(const IndexedSlices& slices);

// The dense tensor of `slices`: rows with equal indices summed in order
// (float16/bfloat16 accumulated in float32). invalid_argument if malformed.
Result<Tensor> Densify(const IndexedSlices& slices);

}  // namespace tessera::collectives
