// Hierarchical all-reduce: a worker holds several local devices' tensors; they are
// reduced in memory first, the per-worker results across the group, and the result
// is copied back to every local device. One transfer per worker instead of one
// per device (TF aggregate_gradients_using_hierarchical_copy).
#pragma once

#include <span>

#include "worker/collectives/collectives.h"

namespace tessera::collectives {

// `local` holds this worker's device tensors in device order (equal dtypes and
// shapes, at least one). Every worker must have the same number of devices (it
// is part of the fingerprint, so a different count is an error naming both).
// The result equals an all-reduce over every device of every worker (flat); mean
// divides by size() · local.size(). In place.
Status HierarchicalAllReduce(Group& group, std::span<Tensor> local,
                             const AllReduceOptions& options = {});

}  // namespace tessera::collectives
