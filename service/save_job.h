// The part of a save that needs no cluster: what tesserad makes of the workers'
// snapshot reports (the rest of the save is SaveMachine, in save_machine.cc).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/status.h"
#include "api/task_protocol.h"
#include "api/tensor_desc.h"

namespace tessera::service {

// The tensors a save writes, from each rank's snapshot (its snapshot task's result, or
// what it brought to the in-loop save's create-or-join). Every worker must hold every
// tensor, on exactly the devices it owns, described as rank 0 describes it, in a layout
// that fits the mesh; errors name the tensor, the worker and its rank. Order: as rank 0
// lists them.
Result<std::vector<TensorMeta>> CollectSnapshotTensors(
    const Mesh& mesh, const std::vector<std::string>& workers,
    const std::map<int64_t, SnapshotResult>& snapshots);

}  // namespace tessera::service
