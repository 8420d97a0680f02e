// tesserad's meshes: registration (validated, placed on workers, self-tested),
// listing and removal, and the per-mesh preemption routes.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "api/names.h"
#include "service/collective_machine.h"
#include "service/service.h"
#include "storage/root_meta.h"

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
Result<std::vector<std::string>> Service::ChooseMeshWorkers(const MeshRequest& r) const {
  const Mesh& mesh = r.mesh;
  std::map<std::string, WorkerRecord> workers;
  std::vector<std::string> order;
  for (WorkerRecord& w : workers_.List()) {
    order.push_back(w.id);
    workers.emplace(w.id, std::move(w));
  }
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
      auto w = workers.find(id);
      if (w == workers.end()) return NotFound("no worker " + id, {{"worker", id}, {"field", "workers"}});
      if (w->second.state != WorkerState::kAlive) {
        return Unavailable("worker " + id + " is " + StateString(w->second.state), {{"worker", id}});
      }
      if (std::count(wanted.begin(), wanted.end(), id) > 1) {
        return InvalidArgument("worker " + id + " is listed twice", {{"field", "workers"}});
      }
    }
    chosen = wanted;
  } else {
    for (const auto& id : order) {
      if (static_cast<int64_t>(chosen.size()) == need) break;
      if (workers.at(id).state == WorkerState::kAlive) chosen.push_back(id);
    }
    if (static_cast<int64_t>(chosen.size()) < need) {
      return Unavailable("mesh " + mesh.ToString() + " needs " + std::to_string(need) +
                             " alive workers, only " + std::to_string(chosen.size()) + " are alive",
                         {{"needed", need}, {"alive", chosen.size()}});
    }
  }
  // The device table check at init (TF DTensor): every worker brings devices_per_worker devices.
  for (size_t rank = 0; rank < chosen.size(); ++rank) {
    const WorkerRecord& w = workers.at(chosen[rank]);
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
// is missing or disagrees is named, and the mesh is withdrawn. Runs on this thread.
Result<Json> Service::SelfTestMesh(const MeshRecord& mesh, int64_t timeout_ms) {
  const std::string& name = mesh.mesh.name;
  JobSpec spec = JobSpec::Of(NewJobId(), mesh, -1, options_.job_timeout_ms);
  const std::string job_id = spec.id;
  Status st = CreateJob(spec, "mesh_init", name, {{"timeout_ms", timeout_ms}});
  if (st.ok()) {
    CollectiveMachine machine(std::move(spec), TaskKind::kMeshInit, Json::object(), timeout_ms);
    st = DriveJob(machine);  // the registration waits for it
  }
  if (!st.ok()) {
    st = st.WithContext("mesh " + name + " failed its self-test (job " + job_id +
                        "), so it is not registered")
             .WithDetail("job", job_id);
    // No job can have started on it (Hold refuses a mesh under test).
    WriteTurns::Turn turn = mesh_writes_.Take();
    Status withdrawn = WriteState(MeshWrite("withdraw mesh " + name, name, MeshStateOf(name),
                                            MeshState{}, [&] { meshes_.Drop(name); }));
    if (!withdrawn.ok()) st = st.WithDetail("withdraw_error", ErrorBody(withdrawn)["error"]);
    return st;
  }
  meshes_.MarkTested(name);
  ASSIGN_OR_RETURN(Json job, jobs_.Get(job_id, 0));
  return Json{{"job", job_id},
              {"ms", job.value("ended_at", int64_t{0}) - job.value("started_at", int64_t{0})}};
}

namespace {

// A PUT of a mesh already registered: 200 when it asks for what is there, else why not.
Result<std::pair<int, Json>> AnswerExisting(const MeshRecord& m, const MeshRequest& r) {
  const std::string& name = m.mesh.name;
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

}  // namespace

Result<std::pair<int, Json>> Service::PutMesh(const std::string& name, const Json& body) {
  ASSIGN_OR_RETURN(MeshRequest r, ParseMeshRequest(name, body));
  if (auto existing = meshes_.Get(name); existing.ok()) return AnswerExisting(*existing, r);
  ASSIGN_OR_RETURN(std::vector<std::string> chosen, ChooseMeshWorkers(r));
  MeshRecord rec{r.mesh, chosen, clock_->WallMs()};
  rec.self_testing = r.self_test;
  {
    WriteTurns::Turn turn = mesh_writes_.Take();
    // Another PUT of the name may have come first.
    if (auto existing = meshes_.Get(name); existing.ok()) return AnswerExisting(*existing, r);
    RETURN_IF_ERROR(WriteState(MeshWrite("register mesh " + name, name, MeshState{},
                                         MeshState{rec, RetentionPolicy{}},
                                         [&] { meshes_.Add(rec); })));
  }
  Json out = rec.ToJson();
  if (r.self_test) {
    ASSIGN_OR_RETURN(out["self_test"], SelfTestMesh(rec, r.self_test_ms));
  }
  events_.Publish("mesh", out);
  return std::make_pair(201, out);
}

MeshState Service::MeshStateOf(const std::string& name) const {
  MeshState state;
  if (auto m = meshes_.Get(name); m.ok()) {
    state.record = std::move(*m);
    state.retention = meshes_.Retention(name).value_or(RetentionPolicy{});
  }
  return state;
}

// The mesh's document in the root (storage/root_meta.h): its record and retention policy,
// or its tombstone once it is gone (a rebuild from the root does not bring it back).
Status Service::WriteMeshDoc(const std::string& name, const MeshState& state) {
  Json doc = {{"name", name}, {"deleted", true}};
  if (state.record) {
    doc = state.record->ToJson();
    doc["retention"] = state.retention.ToJson();
  }
  doc["format"] = 1;
  return storage::WriteMeshDoc(env_, options_.checkpoint_root, name, doc).status();
}

StateWrite Service::MeshWrite(const std::string& what, const std::string& name,
                              const MeshState& before, const MeshState& after,
                              std::function<void()> memory) {
  StateWrite w;
  w.what = what;
  w.root = [this, name, after] { return WriteMeshDoc(name, after); };
  w.undo_root = [this, name, before] { return WriteMeshDoc(name, before); };
  if (after.record) {
    w.catalog = {{"meshes", name, after.record->ToJson()},
                 {"retention", name, after.retention.CatalogRow(name)}};
  } else {
    w.catalog = {{"meshes", name, std::nullopt}, {"retention", name, std::nullopt}};
  }
  // Workers learn placements from their long-polls (docs/architecture.md). A mesh gone
  // takes its memory tier's report with it: one registered again under the name starts clean.
  w.memory = [this, name, gone = !after.record, memory = std::move(memory)] {
    memory();
    if (gone) memory_checkpoints_.Forget(name);
    workers_.PlacementsChanged();
  };
  return w;
}

Json Service::ListMeshes() {
  Json out = Json::array();
  for (const MeshRecord& m : meshes_.List()) out.push_back(meshes_.JsonOf(m));
  return out;
}

Result<Json> Service::GetMesh(const std::string& name) {
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Get(name));
  return meshes_.JsonOf(m);
}

Status Service::DeleteMesh(const std::string& name) {
  {
    WriteTurns::Turn turn = mesh_writes_.Take();
    RETURN_IF_ERROR(meshes_.BeginRemove(name));  // from here no job can hold it
    Status st = WriteState(MeshWrite("delete mesh " + name, name, MeshStateOf(name), MeshState{},
                                     [&] { meshes_.EndRemove(name, /*removed=*/true); }));
    if (!st.ok()) {
      meshes_.EndRemove(name, /*removed=*/false);
      return st;
    }
  }
  events_.Publish("mesh", {{"name", name}, {"deleted", true}});
  // A notice belongs to the job on this mesh; a mesh registered again under the name starts clean.
  Status cleared = coordination_->ClearPreemption(name);
  return cleared.ok() ? cleared
                      : cleared.WithContext("mesh " + name + " is deleted, but its preemption "
                                            "notice stays until a retry clears it");
}

// ---------------------------------------------------------------- preemption

// A notice for a mesh deleted meanwhile is taken back: a mesh registered again under
// the name starts clean.
Result<Json> Service::NoticePreemption(const std::string& mesh, const Json& body) {
  RETURN_IF_ERROR(meshes_.Get(mesh).status());
  ASSIGN_OR_RETURN(Json notice, coordination_->NoticePreemption(mesh, body));
  if (!meshes_.Has(mesh)) {
    (void)coordination_->ClearPreemption(mesh);
    return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  }
  return notice;
}

Result<Json> Service::GetPreemption(const std::string& mesh) {
  RETURN_IF_ERROR(meshes_.Get(mesh).status());
  return coordination_->PreemptionState(mesh);
}

Status Service::ClearPreemption(const std::string& mesh) {
  RETURN_IF_ERROR(meshes_.Get(mesh).status());
  return coordination_->ClearPreemption(mesh);
}

Result<Json> Service::SyncPreemption(const std::string& mesh, const Json& body) {
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Get(mesh));
  return coordination_->SyncPreemption(mesh, m.workers, body);  // blocks
}

}  // namespace tessera::service
