// All-reduce (sum) of indexed slices: the sparse gradient of an embedding, as
// rows `indices` of a dense tensor of `dense_shape` (TF IndexedSlices).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/collectives/collectives.h"

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
};

// Sums `slices` over the group. Both paths give the same Densify(result) (bit
// for bit for integers and exactly representable sums). Every rank passes the
// same dtype and dense_shape; row counts may differ.
Result<IndexedSlices> SparseAllReduce(Group& group, const IndexedSlices& slices,
                                      const SparseAllReduceOptions& options = {});

// The dense tensor of `slices`: rows with equal indices summed in order
// (float16/bfloat16 accumulated in float32). invalid_argument if malformed.
Result<Tensor> Densify(const IndexedSlices& slices);

}  // namespace tessera::collectives
