#include "worker/device_groups.h"

#include <algorithm>
#include <map>
#include <set>

namespace tessera::worker {

int64_t DeviceGroup::CountOn(const Mesh& mesh, int64_t rank) const {
  return std::count_if(devices.begin(), devices.end(),
                       [&](int64_t d) { return mesh.WorkerOfDevice(d) == rank; });
}

int64_t DeviceGroup::FirstPositionOn(const Mesh& mesh, int64_t rank) const {
  for (size_t i = 0; i < devices.size(); ++i) {
    if (mesh.WorkerOfDevice(devices[i]) == rank) return static_cast<int64_t>(i);
  }
  return -1;
}

Result<std::vector<std::string>> NormalizeAxes(const Mesh& mesh,
                                               const std::vector<std::string>& axes) {
  std::vector<std::string> known;
  for (const MeshAxis& a : mesh.axes) known.push_back(a.name);
  std::set<std::string> asked;
  for (const std::string& a : axes) {
    if (mesh.AxisIndex(a) < 0) {
      return InvalidArgument("axis '" + a + "' is not an axis of mesh " + mesh.ToString(),
                             {{"field", "axes"}, {"axis", a}, {"mesh_axes", known}});
    }
    if (!asked.insert(a).second) {
      return InvalidArgument("axis '" + a + "' is named twice", {{"field", "axes"}, {"axis", a}});
    }
  }
  if (axes.empty()) return known;
  std::vector<std::string> ordered;
  for (const std::string& a : known) {
    if (asked.count(a)) ordered.push_back(a);
  }
  return ordered;
}

std::vector<DeviceGroup> DeviceGroups(const Mesh& mesh, const std::vector<std::string>& axes) {
  std::vector<bool> along(mesh.axes.size(), false);
  for (const std::string& a : axes) {
    int i = mesh.AxisIndex(a);
    if (i >= 0) along[i] = true;
  }
  // Devices with equal coordinates on the other axes form one group.
  std::map<std::vector<int64_t>, DeviceGroup> groups;
  std::vector<std::vector<int64_t>> order;
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    std::vector<int64_t> key = mesh.DeviceCoords(d);
    for (size_t i = 0; i < key.size(); ++i) {
      if (along[i]) key[i] = -1;
    }
    auto [it, fresh] = groups.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.devices.push_back(d);
    const int64_t w = mesh.WorkerOfDevice(d);
    if (it->second.workers.empty() || it->second.workers.back() != w) {
      it->second.workers.push_back(w);
    }
  }
  std::vector<DeviceGroup> out;
  for (const auto& key : order) out.push_back(std::move(groups[key]));
  return out;
}

}  // namespace tessera::worker
