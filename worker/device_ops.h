// The device-level collectives of MeshCollectives (device_ops.cc): each op runs on
// this worker's devices of one device group, over the group's workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "api/mesh.h"
#include "api/status.h"
#include "collectives/group.h"
#include "collectives/tensor.h"
#include "worker/collective_request.h"
#include "worker/device_groups.h"
#include "worker/mesh_placement.h"

namespace tessera::worker {

struct CollectiveResult;

// One device group's share of a device-level collective, on this worker.
struct OnGroup {
  const CollectiveRequest& r;
  const MeshPlacement& p;
  const DeviceGroup& g;
  collectives::Group& sub;  // the group's workers
  int64_t n;                // devices in the group
  int64_t count;            // of them on this worker
  int64_t position;         // of this worker's first device in the group
  std::chrono::milliseconds timeout;
};

// Each op takes this worker's devices' inputs of the group and gives their outputs.
using DeviceOp = Result<std::vector<collectives::Tensor>> (*)(
    const OnGroup& on, std::vector<collectives::Tensor>& local);

// "a,b,c": axis names as errors show them.
std::string Join(const std::vector<std::string>& parts);

// Checks what a device-level op needs of the mesh and the request before any group
// forms (the root of a broadcast, say); invalid_argument naming the field.
Status CheckDeviceOp(const Mesh& mesh, const CollectiveRequest& r);

// The op of `op` (all_reduce, all_gather, reduce_scatter, broadcast, assert_equal).
DeviceOp DeviceOpOf(CollectiveOp op);

// sparse_all_reduce of this worker's `count` devices of group `g` (from local device
// `first`, at `position` in the group) into `out`.
Status SparseOnGroup(collectives::Group& sub, const DeviceGroup& g, int64_t position,
                     int64_t count, size_t first, const CollectiveRequest& r,
                     std::vector<collectives::Tensor>& inputs, CollectiveResult& out);

// assert_equal among this worker's own devices of the group, before the group's check.
Status LocalDevicesAgree(const OnGroup& on, const std::vector<collectives::Tensor>& local,
                         const std::string& context);

}  // namespace tessera::worker
