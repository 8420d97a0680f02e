#include "api/mesh.h"

#include <map>
#include <set>

#include "api/names.h"

namespace tessera {

int64_t Mesh::num_devices() const {
  int64_t n = 1;
  for (const auto& a : axes) n *= a.size;
  return n;
}

int Mesh::AxisIndex(std::string_view axis) const {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].name == axis) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int64_t> Mesh::DevicesOfWorker(int64_t rank) const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < devices_per_worker; ++i) out.push_back(rank * devices_per_worker + i);
  return out;
}

std::vector<int64_t> Mesh::DeviceCoords(int64_t device) const {
  std::vector<int64_t> coords(axes.size());
  for (size_t i = axes.size(); i-- > 0;) {
    coords[i] = device % axes[i].size;
    device /= axes[i].size;
  }
  return coords;
}

Status Mesh::Validate() const {
  RETURN_IF_ERROR(ValidateName(name, "mesh"));
  if (axes.empty()) return InvalidArgument("mesh needs at least one axis", {{"field", "axes"}});
  if (axes.size() > kMaxMeshAxes) {
    return InvalidArgument("mesh has " + std::to_string(axes.size()) + " axes; at most " +
                               std::to_string(kMaxMeshAxes) + " are allowed",
                           {{"field", "axes"}});
  }
  std::set<std::string> seen;
  int64_t devices = 1;  // ≤ 2^20 · 65536: no overflow
  for (size_t i = 0; i < axes.size(); ++i) {
    const std::string field = "axes[" + std::to_string(i) + "]";
    const auto& a = axes[i];
    if (a.name.empty() || a.name.size() > 64 || a.name == kUnsharded ||
        a.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") !=
            std::string::npos) {
      return InvalidArgument("invalid axis name '" + a.name +
                                 "': 1-64 letters, digits or '_', and not 'unsharded'",
                             {{"field", field + ".name"}});
    }
    if (!seen.insert(a.name).second) {
      return InvalidArgument("axis '" + a.name + "' appears twice", {{"field", field + ".name"}});
    }
    if (a.size < 1 || a.size > 65536) {
      return InvalidArgument("axis '" + a.name + "' has size " + std::to_string(a.size) +
                                 "; sizes must be 1..65536",
                             {{"field", field + ".size"}});
    }
    devices *= a.size;
    if (devices > (1 << 20)) {
      return InvalidArgument("mesh has more than 2^20 devices", {{"field", "axes"}});
    }
  }
  if (devices_per_worker < 1 || devices % devices_per_worker != 0) {
    return InvalidArgument("the mesh's " + std::to_string(devices) +
                               " devices are not divisible by devices_per_worker=" +
                               std::to_string(devices_per_worker),
                           {{"field", "devices_per_worker"}});
  }
  return Status::Ok();
}

std::string Mesh::ToString() const {
  std::string s = "{";
  for (size_t i = 0; i < axes.size(); ++i) {
    if (i) s += ", ";
    s += axes[i].name + ":" + std::to_string(axes[i].size);
  }
  return s + "}";
}

Layout Layout::Replicated(size_t rank) { return Layout{std::vector<std::string>(rank, kUnsharded)}; }

bool Layout::IsFullyReplicated() const {
  for (const auto& d : dims) {
    if (d != kUnsharded) return false;
  }
  return true;
}

std::string Layout::ToString() const {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + dims[i];
  return s;
}

Result<Layout> ParseLayout(std::string_view text, std::string_view field) {
  Layout layout;
  if (text.empty()) return layout;
  size_t pos = 0;
  while (true) {
    size_t comma = text.find(',', pos);
    std::string part(text.substr(pos, comma == text.npos ? text.npos : comma - pos));
    if (part.empty()) {
      return InvalidArgument("malformed layout '" + std::string(text) +
                                 "': expected entries such as data,unsharded",
                             {{"field", field}});
    }
    layout.dims.push_back(part);
    if (comma == text.npos) break;
    pos = comma + 1;
  }
  return layout;
}

Status ValidateLayout(const Mesh& mesh, const Layout& layout, const Shape& shape) {
  if (layout.dims.size() != shape.size()) {
    return InvalidArgument("layout has " + std::to_string(layout.dims.size()) +
                               " entries but the tensor has " + std::to_string(shape.size()) +
                               " dimensions",
                           {{"field", "layout"}});
  }
  std::set<std::string> used;
  for (size_t i = 0; i < shape.size(); ++i) {
    const auto& d = layout.dims[i];
    if (d == kUnsharded) continue;
    int ax = mesh.AxisIndex(d);
    if (ax < 0) {
      return InvalidArgument("layout names axis '" + d + "' which mesh " + mesh.ToString() +
                                 " does not have",
                             {{"field", "layout"}});
    }
    if (!used.insert(d).second) {
      return InvalidArgument("layout uses axis '" + d + "' for two dimensions",
                             {{"field", "layout"}});
    }
    if (shape[i] % mesh.axes[ax].size != 0) {
      return InvalidArgument("dimension " + std::to_string(i) + " of size " +
                                 std::to_string(shape[i]) + " is not divisible by axis '" + d +
                                 "' of size " + std::to_string(mesh.axes[ax].size),
                             {{"field", "layout"}, {"dimension", i}});
    }
  }
  return Status::Ok();
}

SliceSpec DeviceSlice(const Mesh& mesh, const Layout& layout, const Shape& shape, int64_t device) {
  std::vector<int64_t> coords = mesh.DeviceCoords(device);
  SliceSpec s = FullSlice(shape);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (layout.dims[i] == kUnsharded) continue;
    int ax = mesh.AxisIndex(layout.dims[i]);
    int64_t len = shape[i] / mesh.axes[ax].size;
    s.lengths[i] = len;
    s.offsets[i] = coords[ax] * len;
  }
  return s;
}

Shape LocalShape(const Mesh& mesh, const Layout& layout, const Shape& shape) {
  return DeviceSlice(mesh, layout, shape, 0).lengths;
}

std::vector<SliceReplicas> DistinctSlices(const Mesh& mesh, const Layout& layout,
                                          const Shape& shape) {
  std::vector<SliceReplicas> out;
  std::map<std::vector<int64_t>, size_t> index;  // offsets identify a slice in one layout
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    SliceSpec s = DeviceSlice(mesh, layout, shape, d);
    auto [it, inserted] = index.emplace(s.offsets, out.size());
    if (inserted) out.push_back({std::move(s), {}});
    out[it->second].devices.push_back(d);
  }
  return out;
}

}  // namespace tessera
