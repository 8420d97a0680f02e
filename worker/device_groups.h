// Which devices of a mesh run a collective together: a collective "along" some
// axes joins the devices that differ only in those axes (DTensor / JAX axis
// names), so the mesh splits into groups, one per coordinate of the other axes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/mesh.h"
#include "api/status.h"

namespace tessera::worker {

struct DeviceGroup {
  // Ascending global device ids: the group's order (row-major over the axes, in
  // mesh order). A device's position here is its index within the group.
  std::vector<int64_t> devices;
  // The mesh ranks of the workers owning them, ascending and distinct. Since a
  // worker's devices are consecutive ids, each worker's share is a consecutive
  // run of `devices`, and workers appear in rank order.
  std::vector<int64_t> workers;

  // How many of the group's devices worker `rank` owns, and the position of its first.
  int64_t CountOn(const Mesh& mesh, int64_t rank) const;
  int64_t FirstPositionOn(const Mesh& mesh, int64_t rank) const;
};

// Checks `axes` (known to the mesh, no repeats) and returns them in mesh order;
// empty means every axis. Errors name the axis and the mesh's axes.
Result<std::vector<std::string>> NormalizeAxes(const Mesh& mesh,
                                               const std::vector<std::string>& axes);

// The partition of the mesh's devices into groups along `axes` (normalized),
// ordered by first device.
std::vector<DeviceGroup> DeviceGroups(const Mesh& mesh, const std::vector<std::string>& axes);

}  // namespace tessera::worker
