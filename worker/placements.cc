#include "worker/placements.h"

#include <algorithm>
#include <utility>

namespace tessera::worker {

Result<MeshPlacement> PlacementOf(const Json& mesh, const std::string& worker) {
  ASSIGN_OR_RETURN(Mesh m, MeshFromJson(mesh));
  MeshPlacement p;
  p.mesh = m;
  auto workers = mesh.value("workers", std::vector<std::string>{});
  auto it = std::find(workers.begin(), workers.end(), worker);
  if (it == workers.end()) {
    return Conflict("this worker (" + worker + ") is not part of mesh " + m.name,
                    {{"mesh", m.name}});
  }
  p.rank = it - workers.begin();
  p.workers = std::move(workers);
  p.devices = m.DevicesOfWorker(p.rank);
  p.registration = mesh.value("created_at", int64_t{0});
  return p;
}

std::optional<MeshPlacement> Placements::Find(const std::string& mesh) const {
  MutexLock lock(mu_);
  auto it = by_mesh_.find(mesh);
  if (it == by_mesh_.end()) return std::nullopt;
  return it->second;
}

void Placements::Put(const std::string& mesh, MeshPlacement p) {
  MutexLock lock(mu_);
  by_mesh_[mesh] = std::move(p);
}

void Placements::Forget(const std::string& mesh) {
  MutexLock lock(mu_);
  by_mesh_.erase(mesh);
}

Status Placements::ReplaceAll(const Json& meshes, const std::string& worker) {
  if (!meshes.is_array()) {
    return InvalidArgument("pushed meshes must be an array", {{"field", "meshes"}});
  }
  std::map<std::string, MeshPlacement> fresh;
  Status first;
  for (const Json& m : meshes) {
    Result<MeshPlacement> p = m.is_object() ? PlacementOf(m, worker)
                                            : InvalidArgument("a pushed mesh is not an object");
    if (p.ok()) {
      fresh[p->mesh.name] = std::move(*p);
    } else if (first.ok()) {
      first = p.status().WithContext("pushed mesh " + (m.is_object() ? m.value("name", "") : ""));
    }
  }
  MutexLock lock(mu_);
  by_mesh_ = std::move(fresh);
  return first;
}

std::vector<std::string> Placements::Names() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, p] : by_mesh_) out.push_back(name);
  return out;
}

}  // namespace tessera::worker
