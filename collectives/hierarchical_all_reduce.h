// Hierarchical all-reduce: a worker holds several local devices' tensors; they are
// reduced in memory first, the per-worker results across the group, and the result
// is copied back to every local device. One transfer per worker instead of one
// per device (TF aggregate_gradients_using_hierarchical_copy).
#pragma once

#include <span>

#include "collectives/collectives.h"

namespace tessera::collectives {

struct HierarchicalAllReduceOptions : AllReduceOptions {
  // The number of devices over all workers, when workers hold different numbers
  // of them (a subgroup of a mesh cutting through a worker's devices). -1: every
  // worker holds local.size() devices, which is then part of the fingerprint.
  int64_t total_devices = -1;
};

// `local` holds this worker's device tensors in device order (equal dtypes and
// shapes, at least one). Unless options.total_devices is set, every worker must
// have the same number of devices (a different count is an error naming both).
// The result equals an all-reduce over every device of every worker (flat); mean
// divides by the number of devices. In place.
Status HierarchicalAllReduce(Group& group, std::span<Tensor> local,
                             const HierarchicalAllReduceOptions& options = {});

}  // namespace tessera::collectives
