// The part of a save that needs no cluster: what tesserad makes of the workers'
// snapshot reports (the rest of the save is Service::RunSave, in save_job.cc).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/status.h"
#include "api/tensor_desc.h"

namespace tessera::service {

// The tensors a save writes, from each rank's snapshot report
// ({"tensors":[{name, dtype, shape, layout, devices}]}). Every worker must hold every
// tensor, on exactly the devices it owns, described as rank 0 describes it; errors name
// the tensor, the worker and its rank. Order: as rank 0 lists them.
Result<std::vector<TensorMeta>> CollectSnapshotTensors(const Mesh& mesh,
                                                       const std::vector<std::string>& workers,
                                                       const std::map<int64_t, Json>& snapshots);

}  // namespace tessera::service
