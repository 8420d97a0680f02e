// Batch all-reduce: many tensors (a model's gradients) reduced in a few fused
// messages instead of one collective each (TF cross_device_utils group_by_size).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "collectives/collectives.h"

namespace tessera::collectives {

// Packs of tensor indices, in order. A new pack starts once the last one holds
// more than `bytes_per_pack` bytes, so packs are at least that large (except the
// last); 0 puts everything in one pack. Empty input → no packs.
std::vector<std::vector<size_t>> GroupBySize(std::span<const Tensor> tensors,
                                             size_t bytes_per_pack);

struct BatchAllReduceOptions : AllReduceOptions {
  size_t bytes_per_pack = 0;
};

// Reduces every tensor in place. Each pack is one all-reduce per run of
// consecutive tensors of one dtype. The result equals AllReduce of each tensor
// (bit for bit for integers and exactly representable sums; floats may differ
// in rounding where the ring combines a fused element in another order).
// timeout bounds the whole batch; check_inf_nan reports the first tensor with a
// NaN/Inf after every pack has been reduced.
Status BatchAllReduce(Group& group, std::span<Tensor> tensors,
                      const BatchAllReduceOptions& options = {});

}  // namespace tessera::collectives
