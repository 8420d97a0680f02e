// A restore: checked at the door (StartRestore plans every tensor from the
// checkpoint's record, so a restore that cannot work is a 400), then a read plan
// per target device (any mesh, any layout) read by every target worker; tensors
// land in the target mesh's workers.
#include <algorithm>

#include "api/names.h"
#include "service/restore_plan.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"

namespace tessera::service {

Result<Json> Service::StartRestore(const std::string& mesh, const std::string& step,
                                   const RestoreRequest& request) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
  const std::string target_mesh = request.target_mesh.value_or(mesh);
  ASSIGN_OR_RETURN(const MeshRecord* t, ReadyMesh(target_mesh, "target_mesh"));
  RestoreRun run{"", target_mesh, t->mesh, {}, {}};
  // Only the workers asked for restore (a trainer restoring its own host).
  for (int64_t r = 0; r < t->mesh.num_workers(); ++r) {
    if (!request.workers || std::count(request.workers->begin(), request.workers->end(),
                                       t->workers[r])) {
      run.ranks.push_back(r);
    }
  }
  for (const std::string& w : request.workers.value_or(std::vector<std::string>{})) {
    if (std::find(t->workers.begin(), t->workers.end(), w) == t->workers.end()) {
      return InvalidArgument("worker " + w + " is not a worker of mesh " + target_mesh,
                             {{"field", "workers"}, {"worker", w}, {"mesh", target_mesh}});
    }
  }
  std::vector<TensorMeta> saved;
  for (const Json& tj : c->tensors) {
    auto meta = TensorMetaFromJson(tj);
    if (!meta.ok()) {
      return meta.status().WithContext("the catalog's record of checkpoint " + mesh + " step " +
                                       std::to_string(c->step));
    }
    saved.push_back(std::move(*meta));
  }
  ASSIGN_OR_RETURN(run.tensors,
                   PlanRestoreTensors(saved, request, t->mesh,
                                      "checkpoint " + mesh + " step " + std::to_string(c->step)));
  Json recorded = request.ToJson();
  recorded["target_mesh"] = target_mesh;
  JobRecord* job = NewJob("restore", mesh, c->step, recorded);
  run.job_id = job->id;
  Launch(job->id, [this, run = std::move(run)](const std::string&) { return RunRestore(run); });
  return Json{{"job", job->id}, {"checkpoint", c->Summary()}};
}

Status Service::RunRestore(const RestoreRun& run) {
  MutexLock lock(mu_);
  JobRecord& job = BeginJob(run.job_id);
  const std::string mesh_name = job.mesh;
  const int64_t step = job.step;
  Json result;
  Status st = [&]() REQUIRES(mu_) -> Status {
    auto t = meshes_.find(run.target_name);
    if (t == meshes_.end() || !(t->second.mesh == run.target)) {
      return NotFound("mesh " + run.target_name + " was deleted or changed since the restore began",
                      {{"mesh", run.target_name}});
    }
    const std::vector<std::string> workers = t->second.workers;
    SetPhase(run.job_id, "plan");
    mu_.unlock();
    auto dir = storage::CommittedDir(env_, options_.checkpoint_root, mesh_name, step);
    mu_.lock();
    RETURN_IF_ERROR(dir.status());
    SetPhase(run.job_id, "read");
    std::map<int64_t, Task> tasks;
    uint64_t total = 0;
    Json layouts = Json::array();
    for (const auto& m : run.tensors) {
      layouts.push_back(TensorMetaToJson(m));
      total += NumElements(LocalShape(run.target, m.layout, m.shape)) * DTypeSize(m.dtype) *
               run.target.devices_per_worker * run.ranks.size();
    }
    for (int64_t r : run.ranks) {
      Task& task = tasks[r] = MeshTask(TaskKind::kRestore, run.target, r);
      task.dir = *dir;
      task.tensors = run.tensors;
    }
    ASSIGN_OR_RETURN(auto done, RunTasks(run.job_id, workers, std::move(tasks), total));
    uint64_t read = 0;
    for (const auto& [rank, res] : done) {
      auto restored = RestoreResultFromJson(res);
      if (!restored.ok()) {
        return restored.status().WithContext("the restore of worker " + workers[rank]);
      }
      read += restored->stored_bytes_read;
    }
    Json names = Json::array();
    for (const auto& m : run.tensors) names.push_back(m.name);
    result = {{"target_mesh", run.target_name}, {"tensors", names}, {"bytes", total},
              {"stored_bytes_read", read}, {"layouts", layouts}};
    metrics_.ObserveRestore((WallMs() - jobs_.at(run.job_id).started_ms) / 1000.0, total);
    return Status::Ok();
  }();
  FinishJob(run.job_id, st, result);
  return st;
}

}  // namespace tessera::service
