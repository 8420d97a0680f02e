// A worker's memory checkpoint as the memory tier's tests build it: of a snapshot,
// with its header, before its exchange.
#pragma once

#include <memory>

#include "worker/memory_tier.h"

namespace tessera::worker::memory_testing {

// Step `step` of mesh "m" (fingerprint 7) for `rank`: its own share `snap`; with
// `before`, the checkpoint whose shards it shares (DescribeShare's base).
inline std::shared_ptr<MemoryCheckpoint> NewCheckpoint(std::shared_ptr<const Snapshot> snap, int64_t step,
                                                       int64_t rank, const MemoryPolicy& policy,
                                                       const MemoryLayout& layout,
                                                       const MemoryCheckpoint* before = nullptr) {
  auto ck = std::make_shared<MemoryCheckpoint>();
  ck->mesh = "m";
  ck->step = step;
  ck->rank = rank;
  ck->policy = policy;
  ck->layout = layout;
  ck->mesh_fingerprint = 7;
  ck->own = ShareBytes(snap);
  ck->own_header = DescribeShare(*snap, step, rank, 7, policy.Fingerprint(), Json::object(),
                                 before ? before->own.snapshot().get() : nullptr,
                                 before ? &before->own_header : nullptr);
  return ck;
}

}  // namespace tessera::worker::memory_testing
