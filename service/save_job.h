// The part of a save that needs no cluster: what tesserad makes of the workers'
// joins (the rest of the save is SaveMachine, in save_machine.cc).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/requests.h"
#include "api/mesh.h"
#include "api/status.h"
#include "api/task_protocol.h"
#include "api/tensor_desc.h"
#include "service/records.h"
#include "storage/fragment_json.h"
#include "storage/save_plan.h"

namespace tessera::service {

// The tensors a save writes, from each rank's snapshot (its snapshot task's result, or
// what it brought to the in-loop save's create-or-join). Every worker must hold every
// tensor, on exactly the devices it owns, described as rank 0 describes it, in a layout
// that fits the mesh; errors name the tensor, the worker and its rank. Order: as rank 0
// lists them.
Result<std::vector<TensorMeta>> CollectSnapshotTensors(
    const Mesh& mesh, const std::vector<std::string>& workers,
    const std::map<int64_t, SnapshotResult>& snapshots);

// The joins' fragments, decoded and checked against the plan every worker computed
// from the same snapshots (storage::PlanSave over `metas`): each rank stored exactly
// the slices the plan gives it, of the tensors as `metas` describe them, in shard
// files of its own ("shard-<rank>-…"). Errors name the worker, its rank and the
// tensor. By rank, as MergeSlices takes them.
Result<std::vector<std::vector<storage::FragmentSlice>>> CheckFragments(
    const MeshRecord& mesh, const std::vector<TensorMeta>& metas,
    const std::vector<storage::PlannedSlice>& plan, const std::map<int64_t, SaveJoinRequest>& joins);

}  // namespace tessera::service
