// Mesh, Layout and the slice math that maps (mesh, layout, global shape) to the
// slice each device holds. Devices enumerate the mesh row-major over its axes
// (last axis fastest, as in DTensor); device d lives on worker d / devices_per_worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/shape.h"
#include "api/status.h"

namespace tessera {

struct MeshAxis {
  std::string name;
  int64_t size = 0;
  bool operator==(const MeshAxis&) const = default;
};

struct Mesh {
  std::string name;
  std::vector<MeshAxis> axes;
  int64_t devices_per_worker = 1;

  bool operator==(const Mesh&) const = default;
  // Product of axis sizes.
  int64_t num_devices() const;
  int64_t num_workers() const { return num_devices() / devices_per_worker; }
  // Index of the named axis, or -1.
  int AxisIndex(std::string_view axis) const;
  // Coordinate of `device` along every axis.
  std::vector<int64_t> DeviceCoords(int64_t device) const;
  int64_t WorkerOfDevice(int64_t device) const { return device / devices_per_worker; }
  // The devices of the worker of `rank`: rank·devices_per_worker + [0, devices_per_worker).
  std::vector<int64_t> DevicesOfWorker(int64_t rank) const;
  // Name, axes (unique valid names, sizes ≥ 1) and divisibility by devices_per_worker.
  Status Validate() const;
  // "{data:2, model:2}"
  std::string ToString() const;
};

// One entry per tensor dimension: a mesh axis name or kUnsharded.
inline constexpr const char* kUnsharded = "unsharded";

// A mesh has at most this many axes (a tensor has at most kMaxRank dimensions to
// shard along them) and at most 2^20 devices.
inline constexpr size_t kMaxMeshAxes = 32;

struct Layout {
  std::vector<std::string> dims;

  bool operator==(const Layout&) const = default;
  // All dims unsharded: every device holds the whole tensor.
  static Layout Replicated(size_t rank);
  bool IsFullyReplicated() const;
  // "data,unsharded"
  std::string ToString() const;
};

// Parses "data,unsharded" (empty string = scalar layout).
Result<Layout> ParseLayout(std::string_view text, std::string_view field = "layout");

// Checks that `layout` fits `mesh` and `shape`: one entry per dimension, known
// axes used at most once, each sharded dimension divisible by its axis size.
Status ValidateLayout(const Mesh& mesh, const Layout& layout, const Shape& shape);

// The slice of the global tensor that `device` holds. REQUIRES: ValidateLayout ok.
SliceSpec DeviceSlice(const Mesh& mesh, const Layout& layout, const Shape& shape, int64_t device);
// Shape of one device's local shard.
Shape LocalShape(const Mesh& mesh, const Layout& layout, const Shape& shape);

// A distinct slice and every device holding a copy of it (replicas), ascending.
struct SliceReplicas {
  SliceSpec slice;
  std::vector<int64_t> devices;
};
// Distinct slices of the tensor in order of their first device.
std::vector<SliceReplicas> DistinctSlices(const Mesh& mesh, const Layout& layout,
                                          const Shape& shape);

}  // namespace tessera
