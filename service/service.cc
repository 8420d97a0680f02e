#include "service/service.h"

#include <algorithm>
#include <optional>
#include <cstdio>
#include <set>

#include "api/names.h"
#include "storage/checkpoint_dir.h"
#include "storage/root_epoch.h"
#include "storage/root_meta.h"
#include "storage/shared_chunks.h"
#include "storage/thread_pool.h"

namespace tessera::service {

Service::Service(ServiceOptions options, storage::Env* env, std::unique_ptr<Catalog> catalog)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock()),
      env_(env),
      catalog_(std::move(catalog)) {}

Service::~Service() { Stop(); }

Result<std::unique_ptr<Service>> Service::Create(ServiceOptions options, storage::Env* env) {
  ASSIGN_OR_RETURN(auto catalog, Catalog::Open(env, options.data_dir));
  RETURN_IF_ERROR(env->CreateDirs(options.checkpoint_root));
  std::unique_ptr<Service> s(new Service(std::move(options), env, std::move(catalog)));
  RETURN_IF_ERROR(s->Recover());
  s->PruneJobHistory();  // a catalog from before the history policy may hold many
  CoordinationOptions coordination;
  coordination.max_wait_ms = s->options_.max_wait_ms;
  coordination.clock = s->clock_;
  ASSIGN_OR_RETURN(s->coordination_, Coordination::Open(coordination, s->catalog_.get(),
                                                        &s->events_, &s->metrics_));
  return s;
}

// Workers get one lease to heartbeat again after a restart.
Status Service::RecoverWorkers() {
  const int64_t now = clock_->MonoMs();
  ASSIGN_OR_RETURN(auto workers, catalog_->All("workers"));
  for (const auto& j : workers) workers_.Load(WorkerRecord::FromJson(j), now);
  return Status::Ok();
}

Status Service::RecoverMeshes() {
  ASSIGN_OR_RETURN(auto meshes, catalog_->All("meshes"));
  for (const auto& j : meshes) {
    auto m = MeshRecord::FromJson(j);
    if (m.ok()) meshes_.Load(std::move(*m));
  }
  ASSIGN_OR_RETURN(auto retention, catalog_->All("retention"));
  for (const auto& j : retention) {
    meshes_.LoadRetention(j.value("mesh", ""), RetentionPolicy::FromJson(j));
  }
  return Status::Ok();
}

// Jobs and saves that were running when tesserad stopped have failed, but a save
// whose commit was done: the root holds its step, and the catalog says this job made
// it. That job succeeded (a user who reads it must not save the step again), and
// RebuildFromRoot adopts its checkpoint.
Status Service::RecoverJobsAndCheckpoints() {
  ASSIGN_OR_RETURN(auto checkpoints, catalog_->All("checkpoints"));
  std::map<std::string, CheckpointRecord> by_key;
  for (const auto& j : checkpoints) {
    CheckpointRecord c = CheckpointRecord::FromJson(j);
    by_key[c.key()] = std::move(c);
  }
  std::set<std::string> committed_late;  // checkpoint keys whose save committed
  ASSIGN_OR_RETURN(auto jobs, catalog_->All("jobs"));
  for (const auto& j : jobs) {
    JobRecord r = JobRecord::FromJson(j);
    if (!r.finished()) {
      r.ended_ms = clock_->WallMs();
      const std::string key = CheckpointRecord::Key(r.mesh, r.step);
      auto c = by_key.find(key);
      const bool committed = (r.kind == "save" || r.kind == "import") && c != by_key.end() &&
                             c->second.job == r.id &&
                             storage::CommittedDir(env_, options_.checkpoint_root, r.mesh, r.step).ok();
      if (committed) {
        r.state = JobState::kSucceeded;
        r.phase = "done";
        r.result = {{"recovered", true}, {"checkpoint", {{"mesh", r.mesh}, {"step", r.step}}}};
        committed_late.insert(key);
      } else {
        r.state = JobState::kFailed;
        r.error = ErrorBody(Unavailable("tesserad restarted while the job was running"))["error"];
      }
      (void)PersistJob(r);
    }
    jobs_.Load(std::move(r));
  }
  for (auto& [key, c] : by_key) {
    if (c.state != CheckpointState::kCommitted && c.state != CheckpointState::kFailed &&
        !committed_late.count(key)) {
      c.state = CheckpointState::kFailed;
      c.error = ErrorBody(Unavailable("tesserad restarted during the save"))["error"];
      (void)PersistCheckpoint(c);
    }
    checkpoints_.Load(std::move(c));
  }
  return Status::Ok();
}

// The root is the truth (docs/format.md, "What the root holds"): a mesh the catalog
// lacks comes from its document and one whose document is a tombstone goes, a committed
// checkpoint it lacks comes from its summary (a save that committed but died before the
// catalog saw it, or a catalog lost or wiped), and a checkpoint it lists that the root no
// longer holds goes. The catalog takes all of it in one transaction before memory does.
Status Service::RebuildFromRoot() {
  const std::string& root = options_.checkpoint_root;
  ASSIGN_OR_RETURN(std::vector<std::string> names, storage::ListMeshDirs(env_, root));
  std::vector<std::pair<std::string, int64_t>> missing;  // committed, not in the catalog
  std::vector<CatalogChange> changes;
  std::vector<MeshRecord> found;
  std::vector<std::pair<std::string, RetentionPolicy>> policies;
  std::vector<std::string> gone_meshes, gone_checkpoints;
  for (const std::string& name : names) {
    if (!ValidateName(name, "mesh").ok()) continue;  // not a directory this tesserad made
    ASSIGN_OR_RETURN(auto doc, storage::ReadMeshDoc(env_, root, name));
    if (meshes_.Has(name) && doc && doc->deleted()) {
      std::fprintf(stderr, "mesh %s is in the catalog but deleted in %s: forgotten\n",
                   name.c_str(), root.c_str());
      changes.push_back({"meshes", name, std::nullopt});
      changes.push_back({"retention", name, std::nullopt});
      gone_meshes.push_back(name);
    } else if (!meshes_.Has(name) && doc && !doc->deleted()) {
      auto m = MeshRecord::FromJson(doc->doc);
      if (!m.ok()) return m.status().WithContext("the document of mesh " + name + " in " + root);
      changes.push_back({"meshes", name, m->ToJson()});
      if (doc->doc.contains("retention") && doc->doc["retention"].is_object()) {
        const RetentionPolicy p = RetentionPolicy::FromJson(doc->doc["retention"]);
        changes.push_back({"retention", name, p.CatalogRow(name)});
        policies.emplace_back(name, p);
      }
      found.push_back(std::move(*m));
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, storage::ListSteps(env_, root, name));
    const std::set<int64_t> present(steps.begin(), steps.end());
    for (int64_t step : steps) {
      auto known = checkpoints_.Get(CheckpointRecord::Key(name, step));
      if (!known || known->state != CheckpointState::kCommitted) missing.emplace_back(name, step);
    }
    for (int64_t step : checkpoints_.CommittedSteps(name)) {
      if (present.count(step)) continue;
      const std::string key = CheckpointRecord::Key(name, step);
      std::fprintf(stderr, "checkpoint %s is in the catalog but not in %s: forgotten\n", key.c_str(),
                   root.c_str());
      changes.push_back({"checkpoints", key, std::nullopt});
      gone_checkpoints.push_back(key);
    }
  }
  if (Status st = catalog_->Apply(changes); !st.ok()) {
    st = st.WithContext("bringing the catalog in line with the checkpoint root " + root);
    NoteCatalogFailure("meshes", st);
    return st;
  }
  for (MeshRecord& m : found) meshes_.Load(std::move(m));
  for (auto& [name, p] : policies) meshes_.LoadRetention(name, p);
  for (const std::string& name : gone_meshes) meshes_.Drop(name);
  for (const std::string& key : gone_checkpoints) checkpoints_.Erase(key);
  return AdoptCheckpoints(missing);
}

// Committed checkpoints the catalog lacks: their summaries, read in parallel (8 at a
// time from a file system, 32 from an object store).
Status Service::AdoptCheckpoints(const std::vector<std::pair<std::string, int64_t>>& missing) {
  if (missing.empty()) return Status::Ok();
  std::vector<Result<Json>> summaries(missing.size(), Result<Json>(Json()));
  {
    // An object store answers each GET in tens of ms: more of them in flight.
    storage::ThreadPool pool(env_->IsObjectStore(options_.checkpoint_root) ? 32 : 8);
    for (size_t i = 0; i < missing.size(); ++i) {
      pool.Submit([this, &missing, &summaries, i] {
        const auto& [mesh, step] = missing[i];
        auto dir = storage::CommittedDir(env_, options_.checkpoint_root, mesh, step);
        summaries[i] = dir.ok() ? storage::ReadSummary(env_, *dir) : Result<Json>(dir.status());
      });
    }
  }
  std::vector<std::pair<std::string, Json>> rows;
  for (size_t i = 0; i < missing.size(); ++i) {
    const auto& [mesh, step] = missing[i];
    if (!summaries[i].ok()) {
      // Listed, but not readable: not restorable either, so not listed.
      std::fprintf(stderr, "checkpoint %s step %lld is not adopted: %s\n", mesh.c_str(),
                   static_cast<long long>(step), summaries[i].status().ToString().c_str());
      continue;
    }
    const Json& summary = *summaries[i];
    CheckpointRecord c = checkpoints_.Get(CheckpointRecord::Key(mesh, step)).value_or(CheckpointRecord{});
    c.mesh = mesh;
    c.step = step;
    c.state = CheckpointState::kCommitted;
    c.error = nullptr;
    c.created_ms = summary.value("created_at", int64_t{0});
    c.metadata = summary.value("metadata", Json::object());
    c.TakeSummary(summary);
    rows.emplace_back(c.key(), c.ToJson());
    checkpoints_.Load(std::move(c));
  }
  std::fprintf(stderr, "adopted %zu committed checkpoints from %s\n", rows.size(),
               options_.checkpoint_root.c_str());
  if (Status st = catalog_->PutMany("checkpoints", rows); !st.ok()) {
    NoteCatalogFailure("checkpoints", st);  // memory has them; the next start adopts them again
  }
  return Status::Ok();
}

Status Service::Recover() {
  RETURN_IF_ERROR(RecoverWorkers());
  RETURN_IF_ERROR(RecoverMeshes());
  RETURN_IF_ERROR(RecoverJobsAndCheckpoints());
  // Nothing runs here yet: every staging dir is a leftover, but those of a newer
  // epoch's saves (then this tesserad was deposed already, and the fence says so).
  RETURN_IF_ERROR(Fence("collect garbage at startup"));
  auto removed = storage::CollectGarbage(
      env_, options_.checkpoint_root, [this](const storage::StagingRef& s) { return KeepStaging(s); });
  if (!removed.ok()) return removed.status().WithContext("garbage collection at startup");
  auto swept = SweepRetiredDirs();
  if (!swept.ok()) return swept.status().WithContext("garbage collection at startup");
  return RebuildFromRoot();
}

void Service::Start() {
  monitor_ = std::thread([this] { MonitorLoop(); });
  gc_ = std::thread([this] { GcLoop(); });
}

void Service::Stop() {
  stopping_ = true;
  workers_.Stop();
  jobs_.Stop();
  {
    MutexLock lock(loop_mu_);
    loop_cv_.NotifyAll();
  }
  if (coordination_) coordination_->Shutdown();
  events_.Shutdown();
  if (monitor_.joinable()) monitor_.join();
  if (gc_.joinable()) gc_.join();
  job_threads_.JoinAll();
}

void Service::MonitorLoop() {
  constexpr int64_t kPruneIntervalMs = 1000;
  int64_t next_prune = clock_->MonoMs() + kPruneIntervalMs;
  while (!stopping_) {
    if (clock_->MonoMs() >= next_prune) {
      PruneJobHistory();
      next_prune = clock_->MonoMs() + kPruneIntervalMs;
    }
    {
      MutexLock lock(loop_mu_);
      if (stopping_) return;
      clock_->WaitUntil(loop_cv_, loop_mu_, clock_->MonoMs() + 100);
    }
    const int64_t now = clock_->MonoMs();
    for (const WorkerChange& c : workers_.Scan(now, options_.suspect_ms, options_.lease_ms)) {
      const WorkerRecord& w = c.worker;
      // Every running job hears of a death; those that wait for this worker fail.
      if (w.state == WorkerState::kDead) jobs_.PostAll(JobEvent::WorkerDead(now, w.id, c.silent_ms));
      metrics_.Count("tessera_worker_state_changes_total", "state=\"" + StateString(w.state) + "\"");
      (void)PersistWorker(w);
      PublishWorker(w);
      std::fprintf(stderr, "worker %s is %s (no heartbeat for %lld ms)\n", w.id.c_str(),
                   StateString(w.state).c_str(), static_cast<long long>(c.silent_ms));
    }
  }
}

Result<Json> Service::CollectGarbage() {
  // A save's staging stays while the save is queued or running, including one
  // that starts while this runs (its job exists before its staging does).
  RETURN_IF_ERROR(Fence("collect garbage"));
  auto keep = [this](const storage::StagingRef& s) { return KeepStaging(s); };
  ASSIGN_OR_RETURN(auto removed, storage::CollectGarbage(env_, options_.checkpoint_root, keep));
  // Retired checkpoints' files that no committed checkpoint refers to any more.
  ASSIGN_OR_RETURN(auto swept, SweepRetiredDirs());
  removed.insert(removed.end(), swept.begin(), swept.end());
  ASSIGN_OR_RETURN(auto docs, storage::PruneMeshDocs(env_, options_.checkpoint_root));
  removed.insert(removed.end(), docs.begin(), docs.end());
  // Epoch files: this one and the one before it stay.
  ASSIGN_OR_RETURN(auto epochs, storage::PruneEpochs(env_, options_.checkpoint_root, options_.epoch - 1));
  removed.insert(removed.end(), epochs.begin(), epochs.end());
  for (const auto& path : removed) std::fprintf(stderr, "garbage collected %s\n", path.c_str());
  return Json{{"removed", removed}};
}

Result<std::vector<std::string>> Service::SweepRetiredDirs() {
  std::vector<std::string> removed;
  const std::string& root = options_.checkpoint_root;
  if (!env_->IsObjectStore(root) && !env_->IsDirectory(root)) return removed;
  ASSIGN_OR_RETURN(std::vector<std::string> meshes, storage::ListMeshDirs(env_, root));
  for (const std::string& mesh : meshes) {
    MeshRoots::Turn turn = mesh_roots_.Take(mesh);
    ASSIGN_OR_RETURN(std::vector<std::string> swept, storage::SweepRetired(env_, root, mesh));
    removed.insert(removed.end(), swept.begin(), swept.end());
  }
  return removed;
}

Status Service::Fence(const std::string& what) const {
  return options_.fence ? options_.fence(what) : Status::Ok();
}

std::string Service::NewJobId() const {
  return NewId(options_.epoch > 0 ? "j" + std::to_string(options_.epoch) : "j");
}

bool Service::KeepStaging(const storage::StagingRef& s) const {
  if (s.id != storage::kSaveStagingId) {
    return jobs_.Running(s.id) || storage::EpochOfJobId(s.id) > options_.epoch;
  }
  // A save's staging dir is written before its job exists: kept unless its step is
  // over (committed, or older than the newest committed step) or its save failed and
  // no new one runs.
  auto c = checkpoints_.Get(CheckpointRecord::Key(s.mesh, s.step));
  if (c && jobs_.Running(c->job)) return true;
  if (c && c->state == CheckpointState::kFailed) return false;
  const std::vector<int64_t> steps = checkpoints_.CommittedSteps(s.mesh);
  return steps.empty() || s.step > steps.back();
}

void Service::GcLoop() {
  MutexLock lock(loop_mu_);
  const int64_t interval = options_.gc_interval_ms;
  int64_t next = interval > 0 ? clock_->MonoMs() + interval : 0;
  while (!stopping_) {
    // Due at the next period, or sooner after a failed save (gc_due_ms_).
    int64_t due = next;
    if (gc_due_ms_ > 0 && (due == 0 || gc_due_ms_ < due)) due = gc_due_ms_;
    if (due == 0) {
      loop_cv_.Wait(loop_mu_);
      continue;
    }
    const int64_t now = clock_->MonoMs();
    if (now < due) {
      clock_->WaitUntil(loop_cv_, loop_mu_, due);
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
  return Persist("workers", w.id, w.ToJson(clock_->MonoMs(), {}));
}

Status Service::PersistCheckpoint(const CheckpointRecord& c) {
  return Persist("checkpoints", c.key(), c.ToJson());
}

Status Service::PersistJob(const JobRecord& j) { return Persist("jobs", j.id, j.ToJson()); }

Json Service::Health() const {
  Json health = {{"status", "ok"}};
  if (catalog_failures_.load() > 0) {
    MutexLock lock(catalog_error_mu_);
    health = {{"status", "degraded"},
              {"catalog", {{"write_failures", catalog_failures_.load()}, {"last_error", catalog_error_}}}};
  }
  if (options_.leadership) health.update(options_.leadership());
  return health;
}

void Service::PublishWorker(const WorkerRecord& w) {
  events_.Publish("worker", WorkerJson(w, memory_checkpoints_.WorkerBytes()));
}

Json Service::Cluster() {
  Json coordination = coordination_->Counts();
  const WorkerRegistry::Counts w = workers_.Count();
  Json workers = {{"alive", w.alive}, {"suspect", w.suspect}, {"dead", w.dead}};
  Json jobs = Json::object();
  for (const auto& [state, kinds] : jobs_.Count()) {
    int64_t n = 0;
    for (const auto& [kind, count] : kinds) n += count;
    jobs[state] = n;
  }
  const CheckpointRegistry::Totals c = checkpoints_.Total();
  return {{"version", TESSERA_VERSION},
          {"workers", workers},
          {"meshes", meshes_.Size()},
          {"jobs", jobs},
          {"running_jobs", jobs.value("running", 0) + jobs.value("queued", 0)},
          {"checkpoints", c.committed},
          {"storage_bytes", c.stored_bytes},
          {"logical_bytes", c.logical_bytes},
          {"open_barriers", coordination["open_barriers"]},
          {"preemption_notices", coordination["preemption_notices"]},
          {"kv_keys", coordination["kv_keys"]},
          {"checkpoint_root", options_.checkpoint_root},
          {"leadership", options_.leadership ? options_.leadership() : Json()}};
}

std::string Service::RenderMetrics() {
  std::map<std::string, std::map<std::string, double>> gauges;
  const Json coordination = coordination_->Counts();
  gauges["tessera_barriers_open"][""] = coordination["open_barriers"].get<double>();
  gauges["tessera_preemption_notices"][""] = coordination["preemption_notices"].get<double>();
  gauges["tessera_kv_keys"][""] = coordination["kv_keys"].get<double>();
  gauges["tessera_kv_waiting_gets"][""] = coordination["kv_waiting_gets"].get<double>();
  const WorkerRegistry::Counts w = workers_.Count();
  gauges["tessera_workers"]["state=\"alive\""] = static_cast<double>(w.alive);
  gauges["tessera_workers"]["state=\"suspect\""] = static_cast<double>(w.suspect);
  gauges["tessera_workers"]["state=\"dead\""] = static_cast<double>(w.dead);
  gauges["tessera_task_polls_waiting"][""] = static_cast<double>(w.polls_waiting);
  for (const char* s : {"queued", "running", "succeeded", "failed", "cancelled"}) {
    for (const char* k : {"save", "restore", "verify"}) {
      gauges["tessera_jobs"]["state=\"" + std::string(s) + "\",kind=\"" + k + "\""] = 0;
    }
  }
  for (const auto& [state, kinds] : jobs_.Count()) {
    for (const auto& [kind, count] : kinds) {
      gauges["tessera_jobs"]["state=\"" + state + "\",kind=\"" + kind + "\""] = static_cast<double>(count);
    }
  }
  const CheckpointRegistry::Totals c = checkpoints_.Total();
  gauges["tessera_checkpoints_committed"][""] = static_cast<double>(c.committed);
  gauges["tessera_checkpoint_stored_bytes"][""] = static_cast<double>(c.stored_bytes);
  gauges["tessera_meshes"][""] = static_cast<double>(meshes_.Size());
  gauges["tessera_leader"][""] = 1;  // a standby answers 0 (standby_routes.cc)
  gauges["tessera_root_epoch"][""] = static_cast<double>(options_.epoch);
  if (options_.leadership) {
    const Json l = options_.leadership();
    gauges["tessera_leader_since_seconds"][""] = l.value("leader_since_ms", 0.0) / 1000.0;
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
