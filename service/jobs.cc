// Save, restore and verify jobs: DESIGN.md's protocol driven from tesserad.
//   save:    snapshot (every worker) → plan → write (shard + fragment per writer)
//            → barrier → merge → commit → retention
//   restore: plan per target device → read (every target worker)
//   verify:  every chunk's checksum
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <set>

#include "api/names.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/save_plan.h"
#include "storage/thread_pool.h"
#include "storage/verify.h"

namespace tessera::service {
namespace {

Status StatusFromErrorJson(const Json& e) {
  if (!e.is_object()) return Internal("task failed without an error");
  return Status(CodeFromName(e.value("code", "internal")), e.value("message", "task failed"),
                e.value("details", Json::object()));
}

Result<int64_t> ParseStep(const std::string& text) {
  int64_t step = -1;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (ec != std::errc() || p != text.data() + text.size() || step < 0) {
    return InvalidArgument("step must be a non-negative integer or 'latest', got '" +
                               text.substr(0, 32) + "'",
                           {{"field", "step"}});
  }
  return step;
}

constexpr const char* kCancelled = "cancelled";

Status CancelledStatus(const std::string& job) {
  return Status(Code::kConflict, "job " + job + " was cancelled", {{kCancelled, true}});
}

bool IsCancelled(const Status& st) {
  return st.details().is_object() && st.details().value(kCancelled, false);
}

Json TensorJson(const storage::TensorMeta& m) {
  return {{"name", m.name},
          {"dtype", DTypeName(m.dtype)},
          {"shape", m.shape},
          {"layout", LayoutToJson(m.layout)}};
}

Result<storage::TensorMeta> TensorFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j, "tensor"));
  storage::TensorMeta m;
  ASSIGN_OR_RETURN(m.name, RequiredString(j, "name"));
  ASSIGN_OR_RETURN(m.dtype, DTypeFromJson(j.value("dtype", Json())));
  ASSIGN_OR_RETURN(m.shape, ShapeFromJson(j.value("shape", Json())));
  ASSIGN_OR_RETURN(m.layout, LayoutFromJson(j.value("layout", Json())));
  return m;
}

std::string Describe(const storage::TensorMeta& m) {
  return std::string(DTypeName(m.dtype)) + "[" + ShapeToString(m.shape) + "] layout [" +
         m.layout.ToString() + "]";
}

// The saved layout carried over to `mesh`: axes the mesh lacks, or that do not
// divide the dimension, become unsharded.
Layout AdaptLayout(const Layout& saved, const Shape& shape, const Mesh& mesh) {
  Layout out = saved;
  std::set<std::string> used;
  for (size_t i = 0; i < out.dims.size(); ++i) {
    const std::string& ax = out.dims[i];
    if (ax == kUnsharded) continue;
    int idx = mesh.AxisIndex(ax);
    if (idx < 0 || shape[i] % mesh.axes[idx].size != 0 || !used.insert(ax).second) {
      out.dims[i] = kUnsharded;
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- helpers

JobRecord& Service::BeginJob(const std::string& job_id) {
  JobRecord& job = jobs_.at(job_id);
  job.state = "running";
  job.started_ms = NowMs();
  (void)PersistJob(job);
  PublishJob(job);
  return job;
}

// Closes the current phase's timing.
void ClosePhase(JobRecord* job) {
  const int64_t now = NowMs();
  if (!job->phase.empty() && job->phase_started_ms) {
    job->timings[job->phase] = job->timings.value(job->phase, int64_t{0}) + now - job->phase_started_ms;
  }
  job->phase_started_ms = now;
}

void Service::SetPhase(const std::string& job_id, const std::string& phase) {
  JobRecord& job = jobs_.at(job_id);
  ClosePhase(&job);
  job.phase = phase;
  (void)PersistJob(job);
  PublishJob(job);
  cv_.NotifyAll();
}

void Service::FinishJob(const std::string& job_id, const Status& status, Json result) {
  JobRecord& job = jobs_.at(job_id);
  for (const auto& [tid, t] : job.tasks) task_jobs_.erase(tid);
  ClosePhase(&job);
  job.ended_ms = NowMs();
  job.result = std::move(result);
  if (status.ok()) {
    job.state = "succeeded";
    job.phase = "done";
    job.done_bytes = job.total_bytes;
  } else if (IsCancelled(status)) {
    job.state = "cancelled";
    job.error = ErrorBody(status)["error"];
  } else {
    job.state = "failed";
    job.error = ErrorBody(status)["error"];
  }
  (void)PersistJob(job);
  PublishJob(job);
  cv_.NotifyAll();
  std::fprintf(stderr, "job %s (%s %s step %lld) %s%s\n", job.id.c_str(), job.kind.c_str(),
               job.mesh.c_str(), static_cast<long long>(job.step), job.state.c_str(),
               status.ok() ? "" : (": " + status.message()).c_str());
}

Result<std::map<int64_t, Json>> Service::RunTasks(const std::string& job_id,
                                                  const std::vector<std::string>& workers,
                                                  const std::map<int64_t, Json>& payloads,
                                                  uint64_t total_bytes, int64_t timeout_ms) {
  {
    JobRecord& job = jobs_.at(job_id);
    for (const auto& [tid, t] : job.tasks) task_jobs_.erase(tid);
    job.tasks.clear();
    job.done_bytes = 0;
    job.total_bytes = total_bytes;
    for (const auto& [rank, payload] : payloads) {
      const std::string& wid = workers.at(rank);
      auto w = workers_.find(wid);
      if (w == workers_.end() || w->second.state == "dead") {
        return Unavailable("worker " + wid + " (rank " + std::to_string(rank) + ") is " +
                               (w == workers_.end() ? "not registered" : "dead"),
                           {{"worker", wid}, {"rank", rank}});
      }
      std::string tid = NewId("t");
      Json p = payload;
      p["id"] = tid;
      p["job"] = job_id;
      TaskState ts;
      ts.worker = wid;
      ts.rank = rank;
      job.tasks[tid] = ts;
      task_jobs_[tid] = job_id;
      QueueTask(&w->second, std::move(p));
    }
    PublishJob(job);
  }
  cv_.NotifyAll();
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(timeout_ms >= 0 ? timeout_ms : options_.job_timeout_ms);
  while (true) {
    if (stopping_) return Unavailable("tesserad is shutting down");
    JobRecord& job = jobs_.at(job_id);
    if (job.cancel_requested) return CancelledStatus(job_id);
    bool all_done = true;
    std::vector<int64_t> pending;
    for (const auto& [tid, t] : job.tasks) {
      if (t.state == "succeeded") continue;
      auto who = [&t = t] {
        return "worker " + t.worker + " (rank " + std::to_string(t.rank) + ")";
      };
      if (t.state == "failed") {
        Status st = StatusFromErrorJson(t.error);
        return st.WithContext(who()).WithDetail("worker", t.worker).WithDetail("rank", t.rank);
      }
      auto w = workers_.find(t.worker);
      if (w == workers_.end() || w->second.state == "dead") {
        int64_t age = w == workers_.end() ? 0 : MonoMs() - w->second.last_heartbeat_mono_ms;
        return Unavailable(who() + " is dead: no heartbeat for " + std::to_string(age) + " ms",
                           {{"worker", t.worker}, {"rank", t.rank}});
      }
      all_done = false;
      pending.push_back(t.rank);
    }
    if (all_done) {
      std::map<int64_t, Json> results;
      for (const auto& [tid, t] : job.tasks) results[t.rank] = t.result;
      return results;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceeded("job " + job_id + " timed out in phase " + job.phase +
                                  " waiting for ranks " + Json(pending).dump(),
                              {{"missing_ranks", pending}});
    }
    cv_.WaitFor(mu_, std::chrono::milliseconds(200));
  }
}

Result<CheckpointRecord*> Service::FindCommitted(const std::string& mesh, const std::string& step) {
  if (step == "latest") {
    CheckpointRecord* best = nullptr;
    for (auto& [k, c] : checkpoints_) {
      if (c.mesh == mesh && c.state == "committed" && (!best || c.step > best->step)) best = &c;
    }
    if (!best) return NotFound("mesh " + mesh + " has no committed checkpoint", {{"mesh", mesh}});
    return best;
  }
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  auto it = checkpoints_.find(mesh + "@" + std::to_string(s));
  if (it == checkpoints_.end()) {
    return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(s),
                    {{"mesh", mesh}, {"step", s}});
  }
  if (it->second.state != "committed") {
    return Conflict("checkpoint " + mesh + " step " + std::to_string(s) + " is " +
                        it->second.state + ", not committed",
                    {{"mesh", mesh}, {"step", s}, {"state", it->second.state}});
  }
  return &it->second;
}

// ---------------------------------------------------------------- save

Result<Json> Service::StartSave(const std::string& mesh, const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(int64_t step, RequiredInt(body, "step"));
  if (step < 0) return InvalidArgument("step must be ≥ 0", {{"field", "step"}});
  ASSIGN_OR_RETURN(auto tensors, OptionalNameList(body, "tensors"));
  for (const std::string& t : tensors.value_or(std::vector<std::string>{})) {
    RETURN_IF_ERROR(ValidateName(t, "tensors"));
  }
  ASSIGN_OR_RETURN(auto compression, OptionalString(body, "compression"));
  if (compression && *compression != "zstd" && *compression != "none") {
    return InvalidArgument("compression must be \"zstd\" or \"none\"", {{"field", "compression"}});
  }
  ASSIGN_OR_RETURN(auto level, OptionalInt(body, "level"));
  if (level && (*level < 1 || *level > 19)) {
    return InvalidArgument("level must be 1..19", {{"field", "level"}});
  }
  if (body.contains("metadata") && !body["metadata"].is_null() && !body["metadata"].is_object()) {
    return InvalidArgument("field 'metadata' must be a JSON object", {{"field", "metadata"}});
  }
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(const MeshRecord* m, ReadyMesh(mesh));
  const std::string key = mesh + "@" + std::to_string(step);
  auto existing = checkpoints_.find(key);
  if (existing != checkpoints_.end() && existing->second.state != "failed") {
    const auto& c = existing->second;
    return Conflict("step " + std::to_string(step) + " of mesh " + mesh + " is already " +
                        (c.state == "committed" ? "committed" : "being saved by job " + c.job),
                    {{"mesh", mesh}, {"step", step}, {"state", c.state}, {"job", c.job}});
  }
  for (size_t rank = 0; rank < m->workers.size(); ++rank) {
    const std::string& wid = m->workers[rank];
    auto w = workers_.find(wid);
    if (w == workers_.end() || w->second.state == "dead") {
      return Unavailable("worker " + wid + " (rank " + std::to_string(rank) + ") of mesh " + mesh +
                             " is dead",
                         {{"worker", wid}, {"rank", rank}});
    }
  }
  JobRecord* job = NewJob("save", mesh, step, body);
  CheckpointRecord c;
  c.mesh = mesh;
  c.step = step;
  c.job = job->id;
  c.created_ms = NowMs();
  c.metadata = body.value("metadata", Json::object());
  if (c.metadata.is_null()) c.metadata = Json::object();
  if (Status st = PersistCheckpoint(c); !st.ok()) {
    const std::string id = job->id;  // `job` dies with its entry
    job_order_.erase(std::remove(job_order_.begin(), job_order_.end(), id), job_order_.end());
    jobs_.erase(id);
    (void)catalog_->Delete("jobs", id);
    return st.WithContext("the save of step " + std::to_string(step) + " was not started");
  }
  checkpoints_[key] = c;
  events_.Publish("checkpoint", c.Summary());
  Launch(job->id, &Service::RunSave);
  return Json{{"job", job->id}, {"checkpoint", c.Summary()}};
}

Status Service::RunSave(const std::string& job_id) {
  MutexLock lock(mu_);
  JobRecord& job0 = BeginJob(job_id);
  const std::string mesh_name = job0.mesh;
  const int64_t step = job0.step;
  const Json request = job0.request;
  auto found = meshes_.find(mesh_name);
  if (found == meshes_.end()) {
    Status gone = NotFound("mesh " + mesh_name + " was deleted", {{"mesh", mesh_name}});
    FinishJob(job_id, gone, Json());
    return gone;
  }
  const MeshRecord mesh = found->second;
  const std::string key = mesh_name + "@" + std::to_string(step);
  const std::string staging =
      storage::StagingDir(options_.checkpoint_root, mesh_name, step, job_id);
  auto set_checkpoint_state = [&](const std::string& state) REQUIRES(mu_) {
    CheckpointRecord& c = checkpoints_.at(key);
    c.state = state;
    (void)PersistCheckpoint(c);
    events_.Publish("checkpoint", c.Summary());
  };
  Json result;
  // The lambda drops mu_ around I/O with mu_.unlock() / mu_.lock(): the
  // thread-safety analysis follows those, not calls on the captured `lock`.
  Status st = [&]() REQUIRES(mu_) -> Status {
    // 1. Snapshot: every worker copies its local shards; the trainer may go on.
    SetPhase(job_id, "snapshot");
    std::map<int64_t, Json> snap;
    for (int64_t r = 0; r < mesh.mesh.num_workers(); ++r) {
      snap[r] = {{"kind", "snapshot"}, {"mesh", MeshToJson(mesh.mesh)}, {"rank", r},
                 {"step", step}, {"tensors", request.value("tensors", Json())},
                 {"wait_for_trainer", request.value("wait_for_trainer", false)}};
    }
    ASSIGN_OR_RETURN(auto snapshots, RunTasks(job_id, mesh.workers, snap, 0));

    // 2. Plan: every worker must hold every tensor, identically described.
    std::vector<storage::TensorMeta> metas;
    std::map<std::string, size_t> seen;
    for (const auto& [rank, res] : snapshots) {
      const std::string& wid = mesh.workers[rank];
      const Json list = res.value("tensors", Json::array());
      for (const auto& tj : list) {
        auto t = TensorFromJson(tj);
        if (!t.ok()) return t.status().WithContext("snapshot of worker " + wid);
        auto devices = tj.value("devices", std::vector<int64_t>{});
        std::vector<int64_t> owned;
        for (int64_t i = 0; i < mesh.mesh.devices_per_worker; ++i) {
          owned.push_back(rank * mesh.mesh.devices_per_worker + i);
        }
        if (devices != owned) {
          return InvalidArgument("worker " + wid + " (rank " + std::to_string(rank) +
                                     ") holds tensor '" + t->name + "' on devices " +
                                     Json(devices).dump() + " but owns " + Json(owned).dump() +
                                     "; push every local shard before saving",
                                 {{"tensor", t->name}, {"worker", wid}, {"rank", rank}});
        }
        auto [it, inserted] = seen.emplace(t->name, metas.size());
        if (inserted) {
          if (rank != 0) {
            return InvalidArgument("tensor '" + t->name + "' is missing on worker " +
                                       mesh.workers[0] + " (rank 0)",
                                   {{"tensor", t->name}, {"worker", mesh.workers[0]}, {"rank", 0}});
          }
          metas.push_back(*t);
        } else if (!(metas[it->second] == *t)) {
          return InvalidArgument("tensor '" + t->name + "' is " + Describe(metas[it->second]) +
                                     " on rank 0 but " + Describe(*t) + " on worker " + wid +
                                     " (rank " + std::to_string(rank) + ")",
                                 {{"tensor", t->name}, {"worker", wid}, {"rank", rank}});
        }
      }
      if (list.size() != metas.size()) {
        std::set<std::string> here;
        for (const auto& tj : list) here.insert(tj.value("name", ""));
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
      return InvalidArgument("mesh " + mesh_name + " holds no tensors to save; push some first",
                             {{"mesh", mesh_name}});
    }
    auto plan = storage::PlanSave(mesh.mesh, metas);
    mu_.unlock();
    Status created = storage::CreateStaging(env_, options_.checkpoint_root, mesh_name, step, job_id);
    mu_.lock();
    RETURN_IF_ERROR(created);
    set_checkpoint_state("writing");

    // 3. Write: each writer stores its slices; replicated slices were assigned once.
    SetPhase(job_id, "write");
    std::map<int64_t, Json> writes;
    uint64_t total = 0;
    for (int64_t r = 0; r < mesh.mesh.num_workers(); ++r) {
      writes[r] = {{"kind", "write"}, {"mesh", MeshToJson(mesh.mesh)}, {"rank", r},
                   {"step", step}, {"staging", staging}, {"slices", Json::array()},
                   {"compression", request.value("compression", Json("zstd"))},
                   {"level", request.value("level", Json(1))}};
    }
    for (const auto& p : plan) {
      writes[p.rank]["slices"].push_back({{"tensor", metas[p.tensor].name},
                                          {"device", p.device},
                                          {"offsets", p.slice.offsets},
                                          {"lengths", p.slice.lengths}});
      total += p.bytes;
    }
    ASSIGN_OR_RETURN(auto written, RunTasks(job_id, mesh.workers, writes, total));

    // 4. Barrier passed (every writer reported) → merge → commit.
    SetPhase(job_id, "merge");
    set_checkpoint_state("merging");
    std::vector<std::string> fragments;
    for (const auto& [rank, res] : written) {
      if (res.contains("fragment") && res["fragment"].is_string()) {
        fragments.push_back(res["fragment"].get<std::string>());
      }
    }
    storage::CheckpointMeta meta{mesh.mesh, step, request.value("metadata", Json::object()),
                                 NowMs()};
    if (meta.metadata.is_null()) meta.metadata = Json::object();
    mu_.unlock();
    Status merged = storage::MergeFragments(env_, staging, fragments, meta);
    mu_.lock();
    RETURN_IF_ERROR(merged);
    if (jobs_.at(job_id).cancel_requested) return CancelledStatus(job_id);
    SetPhase(job_id, "commit");
    mu_.unlock();
    Status committed = storage::Commit(env_, options_.checkpoint_root, mesh_name, step, job_id);
    auto dir = committed.ok()
                   ? storage::CommittedDir(env_, options_.checkpoint_root, mesh_name, step)
                   : Result<std::string>(committed);
    auto index = dir.ok() ? storage::CheckpointIndex::Open(env_, *dir)
                          : Result<storage::CheckpointIndex>(dir.status());
    mu_.lock();
    RETURN_IF_ERROR(index.status());
    CheckpointRecord& c = checkpoints_.at(key);
    c.tensors = Json::array();
    for (const auto& t : index->tensors()) {
      Json tj = TensorJson(t.meta);
      tj["logical_bytes"] = t.meta.logical_bytes();
      tj["stored_bytes"] = t.stored_bytes;
      c.tensors.push_back(tj);
    }
    c.logical_bytes = index->logical_bytes();
    c.stored_bytes = index->stored_bytes();
    c.duration_ms = NowMs() - jobs_.at(job_id).started_ms;
    set_checkpoint_state("committed");
    metrics_.ObserveSave(c.duration_ms / 1000.0, c.logical_bytes);
    result = {{"checkpoint", c.Summary()},
              {"bytes_per_rank", storage::BytesPerRank(mesh.mesh, plan)}};

    // 5. Retention.
    SetPhase(job_id, "retention");
    mu_.unlock();
    Status retained = ApplyRetention(mesh_name);
    mu_.lock();
    if (!retained.ok()) result["retention_error"] = ErrorBody(retained)["error"];
    return Status::Ok();
  }();
  if (!st.ok()) {
    CheckpointRecord& c = checkpoints_.at(key);
    if (c.state != "committed") {
      c.state = "failed";
      c.error = ErrorBody(st)["error"];
      (void)PersistCheckpoint(c);
      events_.Publish("checkpoint", c.Summary());
    }
    // Workers drop their snapshots; the staging dir goes.
    for (const auto& wid : mesh.workers) {
      auto w = workers_.find(wid);
      if (w != workers_.end() && w->second.state != "dead") {
        QueueTask(&w->second, {{"id", NewId("t")}, {"job", job_id}, {"kind", "abort"}});
      }
    }
    cv_.NotifyAll();
    lock.unlock();
    (void)env_->DeleteTree(staging);
    lock.lock();
    // Workers still writing when the job failed may leave files behind it.
    gc_due_ms_ = MonoMs() + options_.lease_ms;
    cv_.NotifyAll();
  }
  FinishJob(job_id, st, result);
  return st;
}

Status Service::ApplyRetention(const std::string& mesh) {
  std::vector<int64_t> doomed;
  {
    MutexLock lock(mu_);
    auto p = retention_.find(mesh);
    if (p == retention_.end()) return Status::Ok();
    std::vector<int64_t> steps;
    for (const auto& [k, c] : checkpoints_) {
      if (c.mesh == mesh && c.state == "committed") steps.push_back(c.step);
    }
    std::sort(steps.begin(), steps.end());
    doomed = StepsToPrune(steps, p->second);
  }
  for (int64_t step : doomed) {
    RETURN_IF_ERROR(DeleteCheckpoint(mesh, std::to_string(step)));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- checkpoints

Result<Json> Service::ListCheckpoints(const std::string& mesh) {
  MutexLock lock(mu_);
  std::vector<const CheckpointRecord*> list;
  for (const auto& [k, c] : checkpoints_) {
    if (c.mesh == mesh) list.push_back(&c);
  }
  if (list.empty() && !meshes_.count(mesh)) return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->step > b->step; });
  Json out = Json::array();
  for (auto* c : list) out.push_back(c->Summary());
  return out;
}

Result<Json> Service::GetCheckpoint(const std::string& mesh, const std::string& step) {
  MutexLock lock(mu_);
  if (step == "latest") {
    ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
    return c->ToJson();
  }
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  auto it = checkpoints_.find(mesh + "@" + std::to_string(s));
  if (it == checkpoints_.end()) {
    return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(s),
                    {{"mesh", mesh}, {"step", s}});
  }
  return it->second.ToJson();
}

Status Service::DeleteCheckpoint(const std::string& mesh, const std::string& step_text) {
  ASSIGN_OR_RETURN(int64_t step, ParseStep(step_text));
  const std::string key = mesh + "@" + std::to_string(step);
  {
    MutexLock lock(mu_);
    auto it = checkpoints_.find(key);
    if (it == checkpoints_.end()) {
      return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(step),
                      {{"mesh", mesh}, {"step", step}});
    }
    if (it->second.state != "committed" && it->second.state != "failed") {
      return Conflict("checkpoint is being saved by job " + it->second.job,
                      {{"job", it->second.job}});
    }
    for (const auto& [id, j] : jobs_) {
      if (!j.finished() && j.mesh == mesh && j.step == step) {
        return Conflict("job " + id + " is using this checkpoint", {{"job", id}});
      }
    }
  }
  Status st = storage::DeleteCheckpoint(env_, options_.checkpoint_root, mesh, step);
  if (!st.ok() && st.code() != Code::kNotFound) return st;
  MutexLock lock(mu_);
  checkpoints_.erase(key);
  RETURN_IF_ERROR(catalog_->Delete("checkpoints", key));
  events_.Publish("checkpoint", {{"mesh", mesh}, {"step", step}, {"state", "deleted"}});
  return Status::Ok();
}

Result<Json> Service::PutRetention(const std::string& mesh, const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(auto keep_last, OptionalInt(body, "keep_last"));
  ASSIGN_OR_RETURN(auto every, OptionalInt(body, "keep_every_n_steps"));
  if ((keep_last && *keep_last < 0) || (every && *every < 0)) {
    return InvalidArgument("retention values must be ≥ 0",
                           {{"field", keep_last && *keep_last < 0 ? "keep_last" : "keep_every_n_steps"}});
  }
  RetentionPolicy p{keep_last.value_or(0), every.value_or(0)};
  {
    MutexLock lock(mu_);
    if (!meshes_.count(mesh)) return NotFound("no mesh " + mesh, {{"mesh", mesh}});
    retention_[mesh] = p;
    Json doc = p.ToJson();
    doc["mesh"] = mesh;
    RETURN_IF_ERROR(catalog_->Put("retention", mesh, doc));
  }
  RETURN_IF_ERROR(ApplyRetention(mesh));
  Json out = p.ToJson();
  out["mesh"] = mesh;
  return out;
}

// ---------------------------------------------------------------- restore

Result<Json> Service::StartRestore(const std::string& mesh, const std::string& step,
                                   const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(auto target, OptionalString(body, "target_mesh"));
  if (body.contains("tensors") && !body["tensors"].is_null() && !body["tensors"].is_array()) {
    return InvalidArgument("field 'tensors' must be a list", {{"field", "tensors"}});
  }
  if (body.contains("layouts") && !body["layouts"].is_null() && !body["layouts"].is_object()) {
    return InvalidArgument("field 'layouts' must be an object {tensor: layout}",
                           {{"field", "layouts"}});
  }
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
  const std::string target_mesh = target.value_or(mesh);
  ASSIGN_OR_RETURN(const MeshRecord* t, ReadyMesh(target_mesh, "target_mesh"));
  if (body.contains("workers") && !body["workers"].is_null()) {
    // Only these workers of the target mesh restore (a trainer restoring its own host).
    if (!body["workers"].is_array() || body["workers"].empty()) {
      return InvalidArgument("field 'workers' must be a non-empty list of worker ids",
                             {{"field", "workers"}});
    }
    const auto& members = t->workers;
    for (const auto& w : body["workers"]) {
      if (!w.is_string() ||
          std::find(members.begin(), members.end(), w.get<std::string>()) == members.end()) {
        return InvalidArgument("worker " + (w.is_string() ? w.get<std::string>() : w.dump()) +
                                   " is not a worker of mesh " + target_mesh,
                               {{"field", "workers"}, {"worker", w}, {"mesh", target_mesh}});
      }
    }
  }
  Json request = body;
  request["target_mesh"] = target_mesh;
  JobRecord* job = NewJob("restore", mesh, c->step, request);
  Launch(job->id, &Service::RunRestore);
  return Json{{"job", job->id}, {"checkpoint", c->Summary()}};
}

Status Service::RunRestore(const std::string& job_id) {
  MutexLock lock(mu_);
  JobRecord& job0 = BeginJob(job_id);
  const Json request = job0.request;
  const std::string mesh_name = job0.mesh;
  const int64_t step = job0.step;
  std::string dir;
  const std::string target_name = request.value("target_mesh", job0.mesh);
  Json result;
  // Drops mu_ through mu_ itself, as RunSave does.
  Status st = [&]() REQUIRES(mu_) -> Status {
    auto t = meshes_.find(target_name);
    if (t == meshes_.end()) return NotFound("no mesh " + target_name, {{"mesh", target_name}});
    const MeshRecord target = t->second;
    SetPhase(job_id, "plan");
    mu_.unlock();
    auto committed = storage::CommittedDir(env_, options_.checkpoint_root, mesh_name, step);
    if (committed.ok()) dir = *committed;
    auto index = committed.ok() ? storage::CheckpointIndex::Open(env_, dir)
                                : Result<storage::CheckpointIndex>(committed.status());
    mu_.lock();
    RETURN_IF_ERROR(index.status());
    // Tensors in the order asked for (SEMANTICS: names are restored in the order given).
    std::vector<storage::TensorMeta> wanted;
    const Json names = request.value("tensors", Json());
    const Json layouts = request.value("layouts", Json::object());
    auto add = [&](const std::string& name, const Json& spec) -> Status {
      const storage::TensorEntry* e = index->Find(name);
      if (!e) {
        return NotFound("checkpoint " + job0.mesh + " step " + std::to_string(job0.step) +
                            " has no tensor '" + name + "'",
                        {{"tensor", name}});
      }
      storage::TensorMeta m = e->meta;
      if (spec.is_object()) {
        if (spec.contains("dtype")) {
          ASSIGN_OR_RETURN(DType want, DTypeFromJson(spec["dtype"], "tensors[].dtype"));
          if (want != m.dtype) {
            return InvalidArgument("tensor '" + name + "': the checkpoint holds " +
                                       std::string(DTypeName(m.dtype)) + " but " +
                                       std::string(DTypeName(want)) + " was asked for",
                                   {{"tensor", name}, {"field", "dtype"}});
          }
        }
        if (spec.contains("shape")) {
          ASSIGN_OR_RETURN(Shape want, ShapeFromJson(spec["shape"], "tensors[].shape"));
          if (want != m.shape) {
            return InvalidArgument("tensor '" + name + "': the checkpoint holds shape [" +
                                       ShapeToString(m.shape) + "] but [" + ShapeToString(want) +
                                       "] was asked for",
                                   {{"tensor", name}, {"field", "shape"}});
          }
        }
      }
      if (layouts.is_object() && layouts.contains(name)) {
        ASSIGN_OR_RETURN(m.layout, LayoutFromJson(layouts[name], "layouts." + name));
        Status v = ValidateLayout(target.mesh, m.layout, m.shape);
        if (!v.ok()) return v.WithContext("tensor '" + name + "'").WithDetail("tensor", name);
      } else {
        m.layout = AdaptLayout(m.layout, m.shape, target.mesh);
      }
      wanted.push_back(m);
      return Status::Ok();
    };
    if (names.is_array()) {
      for (const auto& n : names) {
        if (n.is_string()) {
          RETURN_IF_ERROR(add(n.get<std::string>(), Json()));
        } else if (n.is_object() && n.contains("name") && n["name"].is_string()) {
          RETURN_IF_ERROR(add(n["name"].get<std::string>(), n));
        } else {
          return InvalidArgument("each entry of 'tensors' is a name or {name, dtype?, shape?}",
                                 {{"field", "tensors"}});
        }
      }
    } else {
      for (const auto& e : index->tensors()) RETURN_IF_ERROR(add(e.meta.name, Json()));
    }
    SetPhase(job_id, "read");
    std::vector<int64_t> ranks;  // every worker of the target mesh, or those asked for
    const Json only = request.value("workers", Json());
    for (int64_t r = 0; r < target.mesh.num_workers(); ++r) {
      if (only.is_array() && std::find(only.begin(), only.end(), Json(target.workers[r])) ==
                                 only.end()) {
        continue;
      }
      ranks.push_back(r);
    }
    std::map<int64_t, Json> payloads;
    uint64_t total = 0;
    Json tensors = Json::array();
    for (const auto& m : wanted) {
      tensors.push_back(TensorJson(m));
      total += NumElements(LocalShape(target.mesh, m.layout, m.shape)) * DTypeSize(m.dtype) *
               target.mesh.devices_per_worker * ranks.size();
    }
    for (int64_t r : ranks) {
      payloads[r] = {{"kind", "restore"}, {"mesh", MeshToJson(target.mesh)}, {"rank", r},
                     {"dir", dir}, {"tensors", tensors}};
    }
    ASSIGN_OR_RETURN(auto done, RunTasks(job_id, target.workers, payloads, total));
    uint64_t read = 0;
    for (const auto& [rank, res] : done) read += res.value("stored_bytes_read", uint64_t{0});
    Json names_out = Json::array();
    for (const auto& m : wanted) names_out.push_back(m.name);
    result = {{"target_mesh", target_name}, {"tensors", names_out}, {"bytes", total},
              {"stored_bytes_read", read}, {"layouts", tensors}};
    metrics_.ObserveRestore((NowMs() - jobs_.at(job_id).started_ms) / 1000.0, total);
    return Status::Ok();
  }();
  FinishJob(job_id, st, result);
  return st;
}

// ---------------------------------------------------------------- verify

Result<Json> Service::StartVerify(const std::string& mesh, const std::string& step) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
  JobRecord* job = NewJob("verify", mesh, c->step, Json::object());
  Launch(job->id, &Service::RunVerify);
  return Json{{"job", job->id}, {"checkpoint", c->Summary()}};
}

Status Service::RunVerify(const std::string& job_id) {
  MutexLock lock(mu_);
  JobRecord& job = BeginJob(job_id);
  SetPhase(job_id, "verify");
  const std::string mesh_name = job.mesh;
  const int64_t step = job.step;
  lock.unlock();
  storage::ThreadPool pool(2);
  auto last = std::chrono::steady_clock::now();
  auto dir = storage::CommittedDir(env_, options_.checkpoint_root, mesh_name, step);
  auto report = !dir.ok() ? Result<storage::VerifyReport>(dir.status())
                          : storage::VerifyCheckpoint(env_, *dir, &pool, [&](uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(100) && done != total) return;
    last = now;
    MutexLock l(mu_);
    JobRecord& j = jobs_.at(job_id);
    j.done_bytes = done;
    j.total_bytes = total;
    PublishJob(j);
  });
  lock.lock();
  Status st = report.status();
  Json result;
  if (report.ok()) {
    result = report->ToJson();
    if (!report->ok()) {
      std::string first = report->problems.empty()
                              ? "tensor '" + report->bad_chunks[0].tensor + "' in " +
                                    report->bad_chunks[0].file + " at offset " +
                                    std::to_string(report->bad_chunks[0].offset)
                              : report->problems[0];
      st = DataLoss("checkpoint is corrupt: " + std::to_string(report->bad_chunks.size()) +
                        " bad chunks, " + std::to_string(report->problems.size()) +
                        " problems; first: " + first,
                    {{"bad_chunks", result["bad_chunks"]}, {"problems", result["problems"]}});
    }
  }
  FinishJob(job_id, st, result);
  return st;
}

}  // namespace tessera::service
