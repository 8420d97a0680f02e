// tesserad's meshes: registration (validated, placed on workers, self-tested),
// listing and removal, and the per-mesh preemption routes.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "api/names.h"
#include "service/job_machines.h"
#include "service/service.h"

namespace tessera::service {

// ---------------------------------------------------------------- meshes

// What a PUT /api/v1/meshes/{name} asks for, checked without the cluster.
struct MeshRequest {
  Mesh mesh;
  std::optional<std::vector<std::string>> workers;  // as listed, in rank order
  bool self_test = true;
  int64_t self_test_ms = 10000;
};

namespace {

Result<MeshRequest> ParseMeshRequest(const std::string& name, const Json& body) {
  RETURN_IF_ERROR(ValidateName(name, "mesh"));
  MeshRequest r;
  ASSIGN_OR_RETURN(r.mesh, MeshFromJson(body, name));
  if (body.contains("workers") && !body["workers"].is_null()) {
    const Status bad =
        InvalidArgument("field 'workers' must be a list of worker ids", {{"field", "workers"}});
    if (!body["workers"].is_array()) return bad;
    r.workers.emplace();
    for (const auto& w : body["workers"]) {
      if (!w.is_string()) return bad;
      r.workers->push_back(w.get<std::string>());
    }
  }
  ASSIGN_OR_RETURN(std::optional<bool> self_test, OptionalBool(body, "self_test"));
  ASSIGN_OR_RETURN(std::optional<int64_t> self_test_ms, OptionalInt(body, "self_test_timeout_ms"));
  if (self_test_ms && (*self_test_ms < 1 || *self_test_ms > 600000)) {
    return InvalidArgument("self_test_timeout_ms must be 1..600000", {{"field", "self_test_timeout_ms"}});
  }
  r.self_test = self_test.value_or(true);
  r.self_test_ms = self_test_ms.value_or(10000);
  return r;
}

}  // namespace

// The workers of a new mesh, by rank: those listed (each alive, once), or else the
// first alive ones in registration order; each must bring devices_per_worker devices.
Result<std::vector<std::string>> Service::ChooseMeshWorkers(const MeshRequest& r) {
  const Mesh& mesh = r.mesh;
  const int64_t need = mesh.num_workers();
  std::vector<std::string> chosen;
  if (r.workers) {
    const std::vector<std::string>& wanted = *r.workers;
    if (static_cast<int64_t>(wanted.size()) != need) {
      return InvalidArgument("mesh " + mesh.ToString() + " with " +
                                 std::to_string(mesh.devices_per_worker) +
                                 " devices per worker needs " + std::to_string(need) +
                                 " workers, got " + std::to_string(wanted.size()),
                             {{"field", "workers"}});
    }
    for (const auto& id : wanted) {
      auto w = workers_.find(id);
      if (w == workers_.end()) return NotFound("no worker " + id, {{"worker", id}, {"field", "workers"}});
      if (w->second.state != WorkerState::kAlive) {
        return Unavailable("worker " + id + " is " + StateString(w->second.state), {{"worker", id}});
      }
      if (std::count(wanted.begin(), wanted.end(), id) > 1) {
        return InvalidArgument("worker " + id + " is listed twice", {{"field", "workers"}});
      }
    }
    chosen = wanted;
  } else {
    for (const auto& id : worker_order_) {
      if (static_cast<int64_t>(chosen.size()) == need) break;
      if (workers_.at(id).state == WorkerState::kAlive) chosen.push_back(id);
    }
    if (static_cast<int64_t>(chosen.size()) < need) {
      return Unavailable("mesh " + mesh.ToString() + " needs " + std::to_string(need) +
                             " alive workers, only " + std::to_string(chosen.size()) + " are alive",
                         {{"needed", need}, {"alive", chosen.size()}});
    }
  }
  // The device table check at init (TF DTensor): every worker brings devices_per_worker devices.
  for (size_t rank = 0; rank < chosen.size(); ++rank) {
    const WorkerRecord& w = workers_.at(chosen[rank]);
    if (w.devices != mesh.devices_per_worker) {
      return InvalidArgument("worker " + w.id + " (rank " + std::to_string(rank) + ") has " +
                                 std::to_string(w.devices) + " devices but the mesh needs " +
                                 std::to_string(mesh.devices_per_worker) + " per worker",
                             {{"worker", w.id}, {"rank", rank}, {"field", "devices_per_worker"}});
    }
  }
  return chosen;
}

// The self-test of a new mesh: its workers merge the device table over it; a worker that
// is missing or disagrees is named, and the mesh is withdrawn. Drops mu_ while it runs.
Result<Json> Service::SelfTestMesh(const std::string& name, int64_t timeout_ms) {
  JobRecord* job = NewJob("mesh_init", name, -1, {{"timeout_ms", timeout_ms}});
  const std::string job_id = job->id;
  CollectiveMachine machine(JobSpec::Of(job_id, meshes_.at(name), -1, options_.job_timeout_ms),
                            TaskKind::kMeshInit, Json::object(), timeout_ms);
  mu_.unlock();
  Status st = DriveJob(machine);  // on this thread: the registration waits for it
  mu_.lock();
  if (!st.ok()) {
    // No job can have started on it (ReadyMesh refuses a mesh under test).
    meshes_.erase(name);
    (void)catalog_->Delete("meshes", name);
    return st.WithContext("mesh " + name + " failed its self-test (job " + job_id +
                          "), so it is not registered")
        .WithDetail("job", job_id);
  }
  meshes_.at(name).self_testing = false;
  return Json{{"job", job_id}, {"ms", jobs_.at(job_id).ended_ms - jobs_.at(job_id).started_ms}};
}

Result<std::pair<int, Json>> Service::PutMesh(const std::string& name, const Json& body) {
  ASSIGN_OR_RETURN(MeshRequest r, ParseMeshRequest(name, body));
  MutexLock lock(mu_);
  auto existing = meshes_.find(name);
  if (existing != meshes_.end()) {
    const MeshRecord& m = existing->second;
    if (m.self_testing) {
      return Unavailable("mesh " + name + " is running its self-test; try again when it ends",
                         {{"mesh", name}});
    }
    if (m.mesh == r.mesh && (!r.workers || *r.workers == m.workers)) {
      return std::make_pair(200, m.ToJson());
    }
    return Conflict("mesh " + name + " is already registered as " + m.mesh.ToString() + " with " +
                        std::to_string(m.mesh.devices_per_worker) +
                        " devices per worker; delete it first to change it",
                    {{"mesh", name}, {"existing", m.ToJson()}});
  }
  ASSIGN_OR_RETURN(std::vector<std::string> chosen, ChooseMeshWorkers(r));
  MeshRecord rec{r.mesh, chosen, WallMs()};
  rec.self_testing = r.self_test;
  if (Status st = PersistMesh(rec); !st.ok()) {
    return st.WithContext("mesh " + name + " is not registered");
  }
  meshes_[name] = rec;
  Json out = rec.ToJson();
  if (r.self_test) {
    ASSIGN_OR_RETURN(out["self_test"], SelfTestMesh(name, r.self_test_ms));
  }
  events_.Publish("mesh", out);
  return std::make_pair(201, out);
}

Json Service::ListMeshes() {
  MutexLock lock(mu_);
  Json out = Json::array();
  for (const auto& [name, m] : meshes_) out.push_back(MeshJson(m));
  return out;
}

Result<Json> Service::GetMesh(const std::string& name) {
  MutexLock lock(mu_);
  auto it = meshes_.find(name);
  if (it == meshes_.end()) return NotFound("no mesh " + name, {{"mesh", name}});
  return MeshJson(it->second);
}

Json Service::MeshJson(const MeshRecord& m) const {
  Json j = m.ToJson();
  auto r = retention_.find(m.mesh.name);
  j["retention"] = (r == retention_.end() ? RetentionPolicy{} : r->second).ToJson();
  return j;
}

Status Service::DeleteMesh(const std::string& name) {
  MutexLock lock(mu_);
  if (!meshes_.count(name)) return NotFound("no mesh " + name, {{"mesh", name}});
  for (const std::string& id : active_jobs_) {
    if (jobs_.at(id).mesh == name) {
      return Conflict("job " + id + " is running on mesh " + name, {{"job", id}});
    }
  }
  meshes_.erase(name);
  RETURN_IF_ERROR(catalog_->Delete("meshes", name));
  // A notice belongs to the job on this mesh; a mesh registered again under the name starts clean.
  if (Status st = coordination_->ClearPreemption(name); !st.ok()) {
    std::fprintf(stderr, "catalog: %s\n", st.ToString().c_str());
  }
  events_.Publish("mesh", {{"name", name}, {"deleted", true}});
  return Status::Ok();
}

// ---------------------------------------------------------------- preemption

Result<const MeshRecord*> Service::ReadyMesh(const std::string& name,
                                             const std::string& field) const {
  auto it = meshes_.find(name);
  Json details = {{"mesh", name}};
  if (!field.empty()) details["field"] = field;
  if (it == meshes_.end()) return NotFound("no mesh " + name, details);
  if (it->second.self_testing) {
    return Unavailable("mesh " + name + " is running its self-test; no job can start on it yet",
                       details);
  }
  return &it->second;
}

Status Service::CheckMesh(const std::string& name) const {
  return meshes_.count(name) ? Status::Ok() : NotFound("no mesh " + name, {{"mesh", name}});
}

// The notice and its clearing run under mu_ so they cannot race a DeleteMesh.
Result<Json> Service::NoticePreemption(const std::string& mesh, const Json& body) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(CheckMesh(mesh));
  return coordination_->NoticePreemption(mesh, body);
}

Result<Json> Service::GetPreemption(const std::string& mesh) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(CheckMesh(mesh));
  return coordination_->PreemptionState(mesh);
}

Status Service::ClearPreemption(const std::string& mesh) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(CheckMesh(mesh));
  return coordination_->ClearPreemption(mesh);
}

Result<Json> Service::SyncPreemption(const std::string& mesh, const Json& body) {
  std::vector<std::string> workers;
  {
    MutexLock lock(mu_);
    RETURN_IF_ERROR(CheckMesh(mesh));
    workers = meshes_.at(mesh).workers;
  }
  return coordination_->SyncPreemption(mesh, workers, body);  // blocks: not under mu_
}

}  // namespace tessera::service
