// A save, the protocol of docs/architecture.md driven from tesserad:
//   snapshot (every worker) → plan → write (shard + fragment per writer)
//   → barrier → merge → commit → retention
#include "service/save_job.h"

#include <algorithm>
#include <set>

#include "api/names.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/save_plan.h"

namespace tessera::service {

Result<Json> Service::StartSave(const std::string& mesh, const SaveRequest& request) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(const MeshRecord* m, ReadyMesh(mesh));
  auto existing = checkpoints_.find(CheckpointRecord::Key(mesh, request.step));
  if (existing != checkpoints_.end() && existing->second.state != "failed") {
    const auto& c = existing->second;
    return Conflict("step " + std::to_string(request.step) + " of mesh " + mesh + " is already " +
                        (c.state == "committed" ? "committed" : "being saved by job " + c.job),
                    {{"mesh", mesh}, {"step", request.step}, {"state", c.state}, {"job", c.job}});
  }
  ASSIGN_OR_RETURN(const CheckpointRecord* c, CreateSaveJob(*m, request, /*joined=*/false));
  return Json{{"job", c->job}, {"checkpoint", c->Summary()}};
}

Result<const CheckpointRecord*> Service::CreateSaveJob(const MeshRecord& m,
                                                       const SaveRequest& request, bool joined) {
  const std::string& mesh = m.mesh.name;
  const int64_t step = request.step;
  for (size_t rank = 0; rank < m.workers.size(); ++rank) {
    const std::string& wid = m.workers[rank];
    auto w = workers_.find(wid);
    if (w == workers_.end() || w->second.state == "dead") {
      return Unavailable("worker " + wid + " (rank " + std::to_string(rank) + ") of mesh " + mesh +
                             " is dead",
                         {{"worker", wid}, {"rank", rank}});
    }
  }
  Json recorded = request.ToJson();
  if (joined) recorded["joined"] = true;
  JobRecord* job = NewJob("save", mesh, step, recorded);
  CheckpointRecord c;
  c.mesh = mesh;
  c.step = step;
  c.job = job->id;
  c.created_ms = WallMs();
  c.metadata = request.metadata;
  if (Status st = PersistCheckpoint(c); !st.ok()) {
    const std::string id = job->id;  // `job` dies with its entry
    ForgetJob(id);
    (void)catalog_->Delete("jobs", id);
    return st.WithContext("the save of step " + std::to_string(step) + " was not started");
  }
  const std::string key = c.key();
  checkpoints_[key] = std::move(c);
  events_.Publish("checkpoint", checkpoints_[key].Summary());
  if (joined) save_joins_[job->id].request = request;
  Launch(job->id, [this, request](const std::string& id) { return RunSave(id, request); });
  return &checkpoints_[key];
}

Result<std::vector<TensorMeta>> CollectSnapshotTensors(
    const Mesh& mesh, const std::vector<std::string>& workers,
    const std::map<int64_t, SnapshotResult>& snapshots) {
  std::vector<TensorMeta> metas;
  std::map<std::string, size_t> seen;
  for (const auto& [rank, res] : snapshots) {
    if (rank < 0 || rank >= static_cast<int64_t>(workers.size())) {
      return Internal("a snapshot of rank " + std::to_string(rank) + ", which mesh " + mesh.name +
                          " does not have", {{"rank", rank}});
    }
    const std::string& wid = workers[rank];
    const std::vector<SnapshotTensor>& list = res.tensors;
    for (const SnapshotTensor& st : list) {
      const TensorMeta* t = &st.meta;
      const std::vector<int64_t>& devices = st.devices;
      const std::vector<int64_t> owned = mesh.DevicesOfWorker(rank);
      if (devices != owned) {
        return InvalidArgument("worker " + wid + " (rank " + std::to_string(rank) +
                                   ") holds tensor '" + t->name + "' on devices " +
                                   Json(devices).dump() + " but owns " + Json(owned).dump() +
                                   "; push every local shard before saving",
                               {{"tensor", t->name}, {"worker", wid}, {"rank", rank}});
      }
      auto [it, inserted] = seen.emplace(t->name, metas.size());
      if (inserted) {
        Status valid = ValidateName(t->name, "tensor");
        if (valid.ok()) valid = ValidateLayout(mesh, t->layout, t->shape);
        if (!valid.ok()) {
          return valid.WithContext("tensor '" + t->name + "' of worker " + wid)
              .WithDetail("tensor", t->name)
              .WithDetail("worker", wid)
              .WithDetail("rank", rank);
        }
        if (rank != 0) {
          return InvalidArgument("tensor '" + t->name + "' is missing on worker " + workers[0] +
                                     " (rank 0)",
                                 {{"tensor", t->name}, {"worker", workers[0]}, {"rank", 0}});
        }
        metas.push_back(*t);
      } else if (!(metas[it->second] == *t)) {
        return InvalidArgument("tensor '" + t->name + "' is " + metas[it->second].ToString() +
                                   " on rank 0 but " + t->ToString() + " on worker " + wid +
                                   " (rank " + std::to_string(rank) + ")",
                               {{"tensor", t->name}, {"worker", wid}, {"rank", rank}});
      }
    }
    if (list.size() != metas.size()) {
      std::set<std::string> here;
      for (const SnapshotTensor& st : list) here.insert(st.meta.name);
      for (const auto& m : metas) {
        if (!here.count(m.name)) {
          return InvalidArgument("tensor '" + m.name + "' is missing on worker " + wid +
                                     " (rank " + std::to_string(rank) + ")",
                                 {{"tensor", m.name}, {"worker", wid}, {"rank", rank}});
        }
      }
    }
  }
  if (metas.empty()) {
    return InvalidArgument("mesh " + mesh.name + " holds no tensors to save; push some first",
                           {{"mesh", mesh.name}});
  }
  return metas;
}

void Service::SetCheckpointState(const std::string& key, const std::string& state) {
  CheckpointRecord& c = checkpoints_.at(key);
  c.state = state;
  (void)PersistCheckpoint(c);
  events_.Publish("checkpoint", c.Summary());
}

// 1. Snapshot: every worker copies its local shards; the trainer may go on. Then the
//    plan: every slice written once, replicated slices spread over the workers.
Result<std::vector<storage::PlannedSlice>> Service::SaveSnapshotAndPlan(
    const SaveRun& run, std::vector<TensorMeta>* metas) {
  SetPhase(run.job_id, "snapshot");
  if (save_joins_.count(run.job_id)) {
    // In-loop: every worker brought its snapshot with its create-or-join.
    ASSIGN_OR_RETURN(auto joined, AwaitJoins(run));
    ASSIGN_OR_RETURN(*metas, CollectSnapshotTensors(run.mesh.mesh, run.mesh.workers, joined));
    return PlanAndStage(run, *metas);
  }
  std::map<int64_t, Task> snap;
  for (int64_t r = 0; r < run.mesh.mesh.num_workers(); ++r) {
    Task& t = snap[r] = MeshTask(TaskKind::kSnapshot, run.mesh.mesh, r);
    t.step = run.step;
    if (run.request.tensors) t.tensor_names = *run.request.tensors;
    t.wait_for_trainer = run.request.wait_for_trainer;
  }
  ASSIGN_OR_RETURN(auto results, RunTasks(run.job_id, run.mesh.workers, std::move(snap), 0));
  std::map<int64_t, SnapshotResult> snapshots;
  for (const auto& [rank, res] : results) {
    auto snapshot = SnapshotResultFromJson(res);
    if (!snapshot.ok()) {
      const std::string& wid = run.mesh.workers.at(rank);
      return snapshot.status()
          .WithContext("snapshot of worker " + wid)
          .WithDetail("worker", wid)
          .WithDetail("rank", rank);
    }
    snapshots[rank] = std::move(*snapshot);
  }
  ASSIGN_OR_RETURN(*metas, CollectSnapshotTensors(run.mesh.mesh, run.mesh.workers, snapshots));
  return PlanAndStage(run, *metas);
}

Result<std::vector<storage::PlannedSlice>> Service::PlanAndStage(const SaveRun& run,
                                                                 const std::vector<TensorMeta>& metas) {
  auto plan = storage::PlanSave(run.mesh.mesh, metas);
  mu_.unlock();
  Status created =
      storage::CreateStaging(env_, options_.checkpoint_root, run.mesh.mesh.name, run.step, run.job_id);
  mu_.lock();
  RETURN_IF_ERROR(created);
  return plan;
}

// 2. Write: each writer stores its slices (shard + fragment); every report is the barrier.
Result<std::vector<std::string>> Service::SaveWrite(const SaveRun& run,
                                                    const std::vector<TensorMeta>& metas,
                                                    const std::vector<storage::PlannedSlice>& plan) {
  SetCheckpointState(run.key, "writing");
  SetPhase(run.job_id, "write");
  std::map<int64_t, Task> writes;
  uint64_t total = 0;
  for (int64_t r = 0; r < run.mesh.mesh.num_workers(); ++r) {
    Task& t = writes[r] = MeshTask(TaskKind::kWrite, run.mesh.mesh, r);
    t.step = run.step;
    t.staging = run.staging;
    t.compress = run.request.compress;
    t.level = run.request.level;
  }
  for (const auto& p : plan) {
    writes[p.rank].slices.push_back({metas[p.tensor].name, p.device, p.slice});
    total += p.bytes;
  }
  ASSIGN_OR_RETURN(auto written, RunTasks(run.job_id, run.mesh.workers, std::move(writes), total));
  std::vector<std::string> fragments;
  for (const auto& [rank, res] : written) {
    auto w = WriteResultFromJson(res);
    if (!w.ok()) {
      return w.status().WithContext("the write of worker " + run.mesh.workers[rank]);
    }
    if (w->fragment) fragments.push_back(*w->fragment);
  }
  return fragments;
}

// 3. Merge the fragments into index.sqlite, then commit (rename staging → step-<N>).
Result<storage::CheckpointIndex> Service::SaveMergeAndCommit(
    const SaveRun& run, const std::vector<std::string>& fragments) {
  SetPhase(run.job_id, "merge");
  SetCheckpointState(run.key, "merging");
  storage::CheckpointMeta meta{run.mesh.mesh, run.step, run.request.metadata, WallMs()};
  const std::string& mesh = run.mesh.mesh.name;
  mu_.unlock();
  Status merged = storage::MergeFragments(env_, run.staging, fragments, meta);
  mu_.lock();
  RETURN_IF_ERROR(merged);
  if (jobs_.at(run.job_id).cancel_requested) return CancelledStatus(run.job_id);
  SetPhase(run.job_id, "commit");
  mu_.unlock();
  Status committed = storage::Commit(env_, options_.checkpoint_root, mesh, run.step, run.job_id);
  auto dir = committed.ok() ? storage::CommittedDir(env_, options_.checkpoint_root, mesh, run.step)
                            : Result<std::string>(committed);
  auto index = dir.ok() ? storage::CheckpointIndex::Open(env_, *dir)
                        : Result<storage::CheckpointIndex>(dir.status());
  mu_.lock();
  return index;
}

// 4. The committed checkpoint's record: its tensors and sizes, from its index.
Json Service::RecordCommitted(const SaveRun& run, const storage::CheckpointIndex& index,
                              const std::vector<storage::PlannedSlice>& plan) {
  CheckpointRecord& c = checkpoints_.at(run.key);
  c.TakeContentsFrom(index);
  c.duration_ms = WallMs() - jobs_.at(run.job_id).started_ms;
  SetCheckpointState(run.key, "committed");
  metrics_.ObserveSave(c.duration_ms / 1000.0, c.logical_bytes);
  return {{"checkpoint", c.Summary()},
          {"bytes_per_rank", storage::BytesPerRank(run.mesh.mesh, plan)}};
}

// A failed save: the checkpoint is marked failed, workers drop their snapshots, the
// staging dir goes, and the GC runs once late writers must have stopped.
void Service::AbandonSave(const SaveRun& run, const Status& st) {
  CheckpointRecord& c = checkpoints_.at(run.key);
  if (c.state != "committed") {
    c.state = "failed";
    c.error = ErrorBody(st)["error"];
    (void)PersistCheckpoint(c);
    events_.Publish("checkpoint", c.Summary());
  }
  AbortOnWorkers(run.mesh, run.job_id, /*collective=*/false, st);
  mu_.unlock();
  (void)env_->DeleteTree(run.staging);
  mu_.lock();
  // Workers still writing when the job failed may leave files behind it.
  gc_due_ms_ = MonoMs() + options_.lease_ms;
  cv_.NotifyAll();
}

Status Service::RunSave(const std::string& job_id, const SaveRequest& request) {
  MutexLock lock(mu_);
  JobRecord& job = BeginJob(job_id);
  auto found = meshes_.find(job.mesh);
  if (found == meshes_.end()) {
    Status gone = NotFound("mesh " + job.mesh + " was deleted", {{"mesh", job.mesh}});
    FinishJob(job_id, gone, Json());
    save_joins_.erase(job_id);
    return gone;
  }
  const SaveRun run{job_id,
                    found->second,
                    job.step,
                    request,
                    CheckpointRecord::Key(job.mesh, job.step),
                    storage::StagingDir(options_.checkpoint_root, job.mesh, job.step, job_id)};
  Json result;
  Status st = [&]() REQUIRES(mu_) -> Status {
    std::vector<TensorMeta> metas;
    ASSIGN_OR_RETURN(auto plan, SaveSnapshotAndPlan(run, &metas));
    ASSIGN_OR_RETURN(auto fragments, SaveWrite(run, metas, plan));
    ASSIGN_OR_RETURN(auto index, SaveMergeAndCommit(run, fragments));
    result = RecordCommitted(run, index, plan);
    // 5. Retention.
    SetPhase(job_id, "retention");
    mu_.unlock();
    Status retained = ApplyRetention(run.mesh.mesh.name);
    mu_.lock();
    if (!retained.ok()) result["retention_error"] = ErrorBody(retained)["error"];
    return Status::Ok();
  }();
  if (!st.ok()) AbandonSave(run, st);
  FinishJob(job_id, st, result);
  if (save_joins_.erase(job_id)) TellSaveEnded(run, st);
  return st;
}

}  // namespace tessera::service
