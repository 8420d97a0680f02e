#include "service/mesh_registry.h"

#include <algorithm>

namespace tessera::service {

void MeshRegistry::Load(MeshRecord m) {
  MutexLock lock(mu_);
  const std::string name = m.mesh.name;
  meshes_[name].record = std::move(m);
}

void MeshRegistry::LoadRetention(const std::string& mesh, RetentionPolicy p) {
  MutexLock lock(mu_);
  retention_[mesh] = p;
}

std::optional<MeshRecord> MeshRegistry::Add(const MeshRecord& m) {
  MutexLock lock(mu_);
  auto [it, inserted] = meshes_.try_emplace(m.mesh.name);
  if (!inserted) return it->second.record;
  it->second.record = m;
  return std::nullopt;
}

void MeshRegistry::Drop(const std::string& name) {
  MutexLock lock(mu_);
  meshes_.erase(name);
  retention_.erase(name);
}

void MeshRegistry::MarkTested(const std::string& name) {
  MutexLock lock(mu_);
  auto it = meshes_.find(name);
  if (it != meshes_.end()) it->second.record.self_testing = false;
}

Result<MeshRecord> MeshRegistry::Hold(const std::string& name, const std::string& job,
                                      const std::string& field) {
  MutexLock lock(mu_);
  auto it = meshes_.find(name);
  Json details = {{"mesh", name}};
  if (!field.empty()) details["field"] = field;
  if (it == meshes_.end()) return NotFound("no mesh " + name, details);
  if (it->second.record.self_testing) {
    return Unavailable("mesh " + name + " is running its self-test; no job can start on it yet",
                       details);
  }
  if (it->second.removing) return Unavailable("mesh " + name + " is being deleted", details);
  it->second.holders.insert(job);
  return it->second.record;
}

void MeshRegistry::Release(const std::string& name, const std::string& job) {
  MutexLock lock(mu_);
  auto it = meshes_.find(name);
  if (it == meshes_.end()) return;
  auto h = it->second.holders.find(job);
  if (h != it->second.holders.end()) it->second.holders.erase(h);
}

bool MeshRegistry::WorkerHeld(const std::string& worker) const {
  MutexLock lock(mu_);
  for (const auto& [name, e] : meshes_) {
    if (e.holders.empty() && !e.record.self_testing) continue;
    const auto& ws = e.record.workers;
    if (std::find(ws.begin(), ws.end(), worker) != ws.end()) return true;
  }
  return false;
}

Status MeshRegistry::BeginRemove(const std::string& name) {
  MutexLock lock(mu_);
  auto it = meshes_.find(name);
  if (it == meshes_.end()) return NotFound("no mesh " + name, {{"mesh", name}});
  if (it->second.record.self_testing || it->second.removing) {
    return Unavailable("mesh " + name + " is " +
                           (it->second.removing ? "being deleted" : "running its self-test") +
                           "; try again when it ends",
                       {{"mesh", name}});
  }
  if (!it->second.holders.empty()) {
    const std::string& job = *it->second.holders.begin();
    return Conflict("job " + job + " is running on mesh " + name, {{"job", job}});
  }
  it->second.removing = true;
  return Status::Ok();
}

void MeshRegistry::EndRemove(const std::string& name, bool removed) {
  MutexLock lock(mu_);
  auto it = meshes_.find(name);
  if (it == meshes_.end()) return;
  if (!removed) {
    it->second.removing = false;
    return;
  }
  meshes_.erase(it);
  retention_.erase(name);
}

Result<MeshRecord> MeshRegistry::Get(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = meshes_.find(name);
  if (it == meshes_.end()) return NotFound("no mesh " + name, {{"mesh", name}});
  return it->second.record;
}

bool MeshRegistry::Has(const std::string& name) const {
  MutexLock lock(mu_);
  return meshes_.count(name) > 0;
}

std::vector<MeshRecord> MeshRegistry::List() const {
  MutexLock lock(mu_);
  std::vector<MeshRecord> out;
  out.reserve(meshes_.size());
  for (const auto& [name, e] : meshes_) out.push_back(e.record);
  return out;
}

std::vector<std::string> MeshRegistry::MeshesOf(const std::string& worker) const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, e] : meshes_) {
    const auto& ws = e.record.workers;
    if (std::find(ws.begin(), ws.end(), worker) != ws.end()) out.push_back(name);
  }
  return out;
}

size_t MeshRegistry::Size() const {
  MutexLock lock(mu_);
  return meshes_.size();
}

Status MeshRegistry::SetRetention(const std::string& mesh, const RetentionPolicy& p) {
  MutexLock lock(mu_);
  if (!meshes_.count(mesh)) return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  retention_[mesh] = p;
  return Status::Ok();
}

std::optional<RetentionPolicy> MeshRegistry::Retention(const std::string& mesh) const {
  MutexLock lock(mu_);
  auto it = retention_.find(mesh);
  if (it == retention_.end()) return std::nullopt;
  return it->second;
}

Json MeshRegistry::JsonOf(const MeshRecord& m) const {
  Json j = m.ToJson();
  j["retention"] = Retention(m.mesh.name).value_or(RetentionPolicy{}).ToJson();
  return j;
}

}  // namespace tessera::service
