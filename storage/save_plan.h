// Save planning: every distinct slice of every tensor is written exactly once.
// Replicated slices are deduplicated, and each goes to the least-loaded worker
// among those holding a copy, so bytes per worker balance.
#pragma once

#include <cstdint>
#include <vector>

#include "api/mesh.h"
#include "storage/index.h"

namespace tessera::storage {

struct PlannedSlice {
  size_t tensor = 0;   // index into the tensors given to PlanSave
  SliceSpec slice;
  int64_t device = 0;  // a device holding the slice, on the writing worker
  int64_t rank = 0;    // the writing worker
  uint64_t bytes = 0;
};

// REQUIRES: every tensor's layout is valid for `mesh` (ValidateLayout).
// Deterministic for the same inputs.
std::vector<PlannedSlice> PlanSave(const Mesh& mesh, const std::vector<TensorMeta>& tensors);

// Total bytes planned per rank (size mesh.num_workers()).
std::vector<uint64_t> BytesPerRank(const Mesh& mesh, const std::vector<PlannedSlice>& plan);

}  // namespace tessera::storage
