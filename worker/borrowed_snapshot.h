// The snapshot of a /v1/save whose body borrows the trainer's memory (docs/jax.md,
// "Borrowed memory"): no copy while the trainer waits; the shard writer reads the
// bytes as it writes them, and a memory checkpoint copies them once into its own.
#pragma once

#include <memory>

#include "api/json_codec.h"
#include "api/status.h"
#include "worker/mesh_placement.h"
#include "worker/tensor_store.h"

namespace tessera::worker {

// The snapshot of the tensors a /v1/save body's "borrow" (a /v1/restore's "into",
// `field` names which) lends:
//   {"pid": P, "token": hex, "token_address": A,
//    "tensors": [{"name", "dtype", "shape", "layout", "shards": [{"device", "address", "bytes"}]}]}
// Every shard is borrowed (Snapshot::Shard::borrowed), none copied. Refused, naming
// the field: a bad description, a device this worker does not own, a size that is not
// the device's shard of the tensor, an address that is not the process's memory;
// conflict with "reason": "borrow_refused" when the process is not the caller
// (CheckLender: another user, PID namespace, or ptrace policy): the trainer copies then.
Result<std::shared_ptr<const Snapshot>> BorrowedSnapshot(const MeshPlacement& placement,
                                                         const Json& borrow,
                                                         const std::string& field = "borrow");

// `a` and `b` as one snapshot (their tensors disjoint; placement `a`'s); either may be null.
std::shared_ptr<const Snapshot> MergeSnapshots(std::shared_ptr<const Snapshot> a,
                                               std::shared_ptr<const Snapshot> b);

// A copy of `snap` whose borrowed shards are read into buffers of this worker from
// `store`'s snapshot pool (what a memory checkpoint keeps); `snap` itself when
// nothing is borrowed. A borrowed shard whose bytes equal its shard in `base` (the
// memory checkpoint before, Snapshot::BaseShard) shares base's buffer instead
// (compared as TensorStore::TakeSnapshot does, with `base_sums` where known).
Result<std::shared_ptr<const Snapshot>> OwnSnapshot(std::shared_ptr<const Snapshot> snap,
                                                    TensorStore* store, const Snapshot* base = nullptr,
                                                    const ShardChecksums* base_sums = nullptr);

}  // namespace tessera::worker
