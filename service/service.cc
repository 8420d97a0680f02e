#include "service/service.h"

#include <algorithm>
#include <optional>
#include <cstdio>
#include <random>

#include "api/names.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"

namespace tessera::service {

std::string NewId(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          reinterpret_cast<uintptr_t>(&rng));
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%012llx",
                static_cast<unsigned long long>(rng() & 0xffffffffffffULL));
  return prefix + "-" + buf;
}

Service::Service(ServiceOptions options, storage::Env* env, std::unique_ptr<Catalog> catalog)
    : options_(std::move(options)), env_(env), catalog_(std::move(catalog)) {}

Service::~Service() { Stop(); }

Result<std::unique_ptr<Service>> Service::Create(ServiceOptions options, storage::Env* env) {
  ASSIGN_OR_RETURN(auto catalog, Catalog::Open(env, options.data_dir));
  RETURN_IF_ERROR(env->CreateDirs(options.checkpoint_root));
  std::unique_ptr<Service> s(new Service(std::move(options), env, std::move(catalog)));
  RETURN_IF_ERROR(s->Recover());
  s->PruneJobHistory();  // a catalog from before the history policy may hold many
  CoordinationOptions coordination;
  coordination.max_wait_ms = s->options_.max_wait_ms;
  ASSIGN_OR_RETURN(s->coordination_, Coordination::Open(coordination, s->catalog_.get(),
                                                        &s->events_, &s->metrics_));
  return s;
}

// Workers get one lease to heartbeat again after a restart.
Status Service::RecoverWorkers() {
  const int64_t now = MonoMs();
  ASSIGN_OR_RETURN(auto workers, catalog_->All("workers"));
  for (const auto& j : workers) {
    WorkerRecord w = WorkerRecord::FromJson(j);
    w.state = WorkerState::kSuspect;
    w.beat->alive = false;
    w.beat->Touch(now);
    worker_order_.push_back(w.id);
    MutexLock beats(beats_mu_);
    beats_[w.id] = w.beat;
    workers_[w.id] = std::move(w);
  }
  return Status::Ok();
}

Status Service::RecoverMeshes() {
  ASSIGN_OR_RETURN(auto meshes, catalog_->All("meshes"));
  for (const auto& j : meshes) {
    auto m = MeshRecord::FromJson(j);
    if (m.ok()) meshes_[m->mesh.name] = std::move(*m);
  }
  ASSIGN_OR_RETURN(auto retention, catalog_->All("retention"));
  for (const auto& j : retention) {
    RetentionPolicy p;
    p.keep_last = j.value("keep_last", Json(0)).is_number() ? j["keep_last"].get<int64_t>() : 0;
    p.keep_every_n_steps = j.value("keep_every_n_steps", Json(0)).is_number()
                               ? j["keep_every_n_steps"].get<int64_t>()
                               : 0;
    retention_[j.value("mesh", "")] = p;
  }
  return Status::Ok();
}

// Jobs and saves that were running when tesserad stopped have failed.
Status Service::RecoverJobsAndCheckpoints() {
  ASSIGN_OR_RETURN(auto jobs, catalog_->All("jobs"));
  for (const auto& j : jobs) {
    JobRecord r = JobRecord::FromJson(j);
    if (r.id.empty() || jobs_.count(r.id)) continue;
    if (!r.finished()) {
      r.state = JobState::kFailed;
      r.ended_ms = WallMs();
      r.error = ErrorBody(Unavailable("tesserad restarted while the job was running"))["error"];
      (void)PersistJob(r);
    }
    // Catalogs written before jobs had a seq: their load order is their creation order.
    r.seq = std::max(r.seq, last_job_seq_ + 1);
    last_job_seq_ = r.seq;
    job_order_.emplace(r.seq, r.id);
    finished_jobs_[r.mesh].push_back(r.id);
    r.Seal();
    jobs_[r.id] = std::move(r);
  }
  ASSIGN_OR_RETURN(auto checkpoints, catalog_->All("checkpoints"));
  for (const auto& j : checkpoints) {
    CheckpointRecord c = CheckpointRecord::FromJson(j);
    if (c.state != CheckpointState::kCommitted && c.state != CheckpointState::kFailed) {
      c.state = CheckpointState::kFailed;
      c.error = ErrorBody(Unavailable("tesserad restarted during the save"))["error"];
      (void)PersistCheckpoint(c);
    }
    checkpoints_[c.key()] = std::move(c);
  }
  return Status::Ok();
}

// A save that renamed its dir but died before the catalog saw it is complete: adopt it.
void Service::AdoptCommittedDirs() {
  for (const auto& [name, mesh] : meshes_) {
    auto steps = storage::ListSteps(env_, options_.checkpoint_root, name);
    if (!steps.ok()) continue;
    for (int64_t step : *steps) {
      CheckpointRecord& c = checkpoints_[CheckpointRecord::Key(name, step)];
      if (c.state == CheckpointState::kCommitted) continue;
      auto dir = storage::CommittedDir(env_, options_.checkpoint_root, name, step);
      if (!dir.ok()) continue;
      auto index = storage::CheckpointIndex::Open(env_, *dir);
      if (!index.ok()) continue;
      c.mesh = name;
      c.step = step;
      c.state = CheckpointState::kCommitted;
      c.error = nullptr;
      c.created_ms = index->meta().created_at_ms;
      c.metadata = index->meta().metadata;
      c.TakeContentsFrom(*index);
      (void)PersistCheckpoint(c);
    }
  }
}

Status Service::Recover() {
  // Nothing else runs yet; the lock keeps the rules of mu_ uniform.
  MutexLock lock(mu_);
  RETURN_IF_ERROR(RecoverWorkers());
  RETURN_IF_ERROR(RecoverMeshes());
  RETURN_IF_ERROR(RecoverJobsAndCheckpoints());
  // Nothing is running now: every staging dir is a leftover.
  auto removed = storage::CollectGarbage(env_, options_.checkpoint_root);
  if (!removed.ok()) return removed.status().WithContext("garbage collection at startup");
  AdoptCommittedDirs();
  return Status::Ok();
}

void Service::Start() {
  monitor_ = std::thread([this] { MonitorLoop(); });
  gc_ = std::thread([this] { GcLoop(); });
}

void Service::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (auto& [id, w] : workers_) w.task_cv->NotifyAll();
    for (auto& [id, inbox] : inboxes_) inbox->Post(JobEvent::Stop(MonoMs()));
  }
  cv_.NotifyAll();
  if (coordination_) coordination_->Shutdown();
  events_.Shutdown();
  if (monitor_.joinable()) monitor_.join();
  if (gc_.joinable()) gc_.join();
  job_threads_.JoinAll();
}

void Service::MonitorLoop() {
  constexpr int64_t kPruneIntervalMs = 1000;
  int64_t next_prune = MonoMs() + kPruneIntervalMs;
  while (true) {
    if (MonoMs() >= next_prune) {
      PruneJobHistory();
      next_prune = MonoMs() + kPruneIntervalMs;
    }
    MutexLock lock(mu_);
    if (stopping_) return;
    cv_.WaitFor(mu_, std::chrono::milliseconds(100));
    const int64_t now = MonoMs();
    bool changed = false;
    for (auto& [id, w] : workers_) {
      if (w.state == WorkerState::kDead) continue;
      int64_t age = now - w.last_heartbeat_mono_ms();
      const WorkerState state = age > options_.lease_ms    ? WorkerState::kDead
                                : age > options_.suspect_ms ? WorkerState::kSuspect
                                                            : WorkerState::kAlive;
      if (state == w.state) continue;
      w.state = state;
      changed = true;
      w.beat->alive = state == WorkerState::kAlive;
      if (state == WorkerState::kDead) {
        w.tasks.clear();
        // Every running job hears of it; those that wait for this worker fail.
        for (auto& [job, inbox] : inboxes_) inbox->Post(JobEvent::WorkerDead(now, id, age));
      }
      metrics_.Count("tessera_worker_state_changes_total", "state=\"" + StateString(state) + "\"");
      (void)PersistWorker(w);
      events_.Publish("worker", w.ToJson(now, MeshesOfWorker(id)));
      std::fprintf(stderr, "worker %s is %s (no heartbeat for %lld ms)\n", id.c_str(),
                   StateString(state).c_str(), static_cast<long long>(age));
    }
    if (changed) cv_.NotifyAll();
  }
}

Result<Json> Service::CollectGarbage() {
  // A save's staging stays while the save is queued or running, including one
  // that starts while this runs (its job exists before its staging does).
  auto keep = [this](const std::string& id) {
    MutexLock lock(mu_);
    auto it = jobs_.find(id);
    return it != jobs_.end() && (it->second.state == JobState::kQueued || it->second.state == JobState::kRunning);
  };
  ASSIGN_OR_RETURN(auto removed, storage::CollectGarbage(env_, options_.checkpoint_root, keep));
  for (const auto& path : removed) std::fprintf(stderr, "garbage collected %s\n", path.c_str());
  return Json{{"removed", removed}};
}

void Service::GcLoop() {
  MutexLock lock(mu_);
  const int64_t interval = options_.gc_interval_ms;
  int64_t next = interval > 0 ? MonoMs() + interval : 0;
  while (!stopping_) {
    // Due at the next period, or sooner after a failed save (gc_due_ms_).
    int64_t due = next;
    if (gc_due_ms_ > 0 && (due == 0 || gc_due_ms_ < due)) due = gc_due_ms_;
    if (due == 0) {
      cv_.Wait(mu_);
      continue;
    }
    const int64_t now = MonoMs();
    if (now < due) {
      cv_.WaitFor(mu_, std::chrono::milliseconds(due - now));  // woken early by any event
      continue;
    }
    gc_due_ms_ = 0;
    if (interval > 0) next = now + interval;
    lock.unlock();
    auto r = CollectGarbage();
    if (!r.ok()) std::fprintf(stderr, "garbage collection: %s\n", r.status().ToString().c_str());
    lock.lock();
  }
}

// ---------------------------------------------------------------- persistence

Status Service::Persist(const std::string& table, const std::string& key, const Json& doc) {
  Status st = catalog_->Put(table, key, doc);
  if (!st.ok()) {
    st = st.WithContext("catalog " + table + "/" + key);
    NoteCatalogFailure(table, st);
  }
  return st;
}

void Service::NoteCatalogFailure(const std::string& table, const Status& st) {
  std::fprintf(stderr, "catalog: %s\n", st.ToString().c_str());
  catalog_failures_++;
  metrics_.Count("tessera_catalog_write_failures_total", "table=\"" + table + "\"");
  MutexLock lock(catalog_error_mu_);
  catalog_error_ = ErrorBody(st)["error"];
}

Status Service::PersistWorker(const WorkerRecord& w) {
  return Persist("workers", w.id, w.ToJson(MonoMs(), {}));
}

Status Service::PersistMesh(const MeshRecord& m) { return Persist("meshes", m.mesh.name, m.ToJson()); }

Status Service::PersistCheckpoint(const CheckpointRecord& c) {
  return Persist("checkpoints", c.key(), c.ToJson());
}

Status Service::PersistJob(const JobRecord& j) { return Persist("jobs", j.id, j.ToJson()); }

Json Service::Health() const {
  if (catalog_failures_.load() == 0) return {{"status", "ok"}};
  MutexLock lock(catalog_error_mu_);
  return {{"status", "degraded"},
          {"catalog", {{"write_failures", catalog_failures_.load()}, {"last_error", catalog_error_}}}};
}

void Service::PublishJob(const JobRecord& j) {
  const_cast<JobRecord&>(j).published_ms = WallMs();
  events_.Publish("job", j.ToJson());
}

void Service::QueueTask(WorkerRecord* w, const Task& task) {
  w->tasks.push_back(TaskToJson(task));
  w->task_cv->NotifyAll();
}

std::vector<std::string> Service::MeshesOfWorker(const std::string& id) const {
  std::vector<std::string> out;
  for (const auto& [name, m] : meshes_) {
    if (std::find(m.workers.begin(), m.workers.end(), id) != m.workers.end()) out.push_back(name);
  }
  return out;
}

bool Service::WorkerBusy(const std::string& id) const {
  for (const std::string& jid : active_jobs_) {
    const JobRecord& j = jobs_.at(jid);
    for (const auto& [tid, t] : j.tasks) {
      if (t.worker == id) return true;
    }
    auto m = meshes_.find(j.mesh);
    if (m != meshes_.end() &&
        std::find(m->second.workers.begin(), m->second.workers.end(), id) != m->second.workers.end()) {
      return true;
    }
  }
  return false;
}

Json Service::Cluster() {
  Json coordination = coordination_->Counts();
  MutexLock lock(mu_);
  Json workers = {{"alive", 0}, {"suspect", 0}, {"dead", 0}};
  for (const auto& [id, w] : workers_) {
    const std::string s = StateString(w.state);
    workers[s] = workers[s].get<int>() + 1;
  }
  Json jobs = Json::object();
  for (const auto& [id, j] : jobs_) {
    const std::string s = StateString(j.state);
    jobs[s] = jobs.value(s, 0) + 1;
  }
  uint64_t stored = 0, logical = 0, committed = 0;
  for (const auto& [k, c] : checkpoints_) {
    if (c.state != CheckpointState::kCommitted) continue;
    ++committed;
    stored += c.stored_bytes;
    logical += c.logical_bytes;
  }
  return {{"version", TESSERA_VERSION},
          {"workers", workers},
          {"meshes", meshes_.size()},
          {"jobs", jobs},
          {"running_jobs", jobs.value("running", 0) + jobs.value("queued", 0)},
          {"checkpoints", committed},
          {"storage_bytes", stored},
          {"logical_bytes", logical},
          {"open_barriers", coordination["open_barriers"]},
          {"preemption_notices", coordination["preemption_notices"]},
          {"kv_keys", coordination["kv_keys"]},
          {"checkpoint_root", options_.checkpoint_root}};
}

std::string Service::RenderMetrics() {
  std::map<std::string, std::map<std::string, double>> gauges;
  const Json coordination = coordination_->Counts();
  gauges["tessera_barriers_open"][""] = coordination["open_barriers"].get<double>();
  gauges["tessera_preemption_notices"][""] = coordination["preemption_notices"].get<double>();
  gauges["tessera_kv_keys"][""] = coordination["kv_keys"].get<double>();
  gauges["tessera_kv_waiting_gets"][""] = coordination["kv_waiting_gets"].get<double>();
  {
    MutexLock lock(mu_);
    for (const char* s : {"alive", "suspect", "dead"}) {
      gauges["tessera_workers"]["state=\"" + std::string(s) + "\""] = 0;
    }
    for (const auto& [id, w] : workers_) {
      gauges["tessera_workers"]["state=\"" + StateString(w.state) + "\""]++;
    }
    for (const char* s : {"queued", "running", "succeeded", "failed", "cancelled"}) {
      for (const char* k : {"save", "restore", "verify"}) {
        gauges["tessera_jobs"]["state=\"" + std::string(s) + "\",kind=\"" + k + "\""] = 0;
      }
    }
    for (const auto& [id, j] : jobs_) {
      gauges["tessera_jobs"]["state=\"" + StateString(j.state) + "\",kind=\"" + j.kind + "\""]++;
    }
    double committed = 0, stored = 0;
    for (const auto& [k, c] : checkpoints_) {
      if (c.state != CheckpointState::kCommitted) continue;
      committed++;
      stored += c.stored_bytes;
    }
    gauges["tessera_checkpoints_committed"][""] = committed;
    gauges["tessera_checkpoint_stored_bytes"][""] = stored;
    gauges["tessera_meshes"][""] = meshes_.size();
    gauges["tessera_task_polls_waiting"][""] = static_cast<double>(polls_waiting_);
  }
  std::map<std::string, std::map<std::string, double>> counters;
  if (server_stats_) {
    const http::ServerStats st = server_stats_();
    gauges["tessera_http_connections_waiting"][""] = static_cast<double>(st.waiting);
    auto& dropped = counters["tessera_http_connections_dropped_total"];
    dropped["reason=\"header_timeout\""] = static_cast<double>(st.header_timeouts);
    dropped["reason=\"over_cap\""] = static_cast<double>(st.evicted);
    dropped["reason=\"header_too_large\""] = static_cast<double>(st.header_too_large);
    dropped["reason=\"tls_handshake\""] = static_cast<double>(st.tls_failures);
    dropped["reason=\"unauthenticated\""] = static_cast<double>(st.unauthenticated_at_gate);
  }
  return metrics_.Render(gauges, counters);
}

}  // namespace tessera::service
