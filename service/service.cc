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
    w.state = "suspect";
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
      r.state = "failed";
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
    if (c.state != "committed" && c.state != "failed") {
      c.state = "failed";
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
      if (c.state == "committed") continue;
      auto dir = storage::CommittedDir(env_, options_.checkpoint_root, name, step);
      if (!dir.ok()) continue;
      auto index = storage::CheckpointIndex::Open(env_, *dir);
      if (!index.ok()) continue;
      c.mesh = name;
      c.step = step;
      c.state = "committed";
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
      if (w.state == "dead") continue;
      int64_t age = now - w.last_heartbeat_mono_ms();
      std::string state = age > options_.lease_ms ? "dead" : age > options_.suspect_ms ? "suspect" : "alive";
      if (state == w.state) continue;
      w.state = state;
      changed = true;
      w.beat->alive = state == "alive";
      if (state == "dead") w.tasks.clear();
      metrics_.Count("tessera_worker_state_changes_total", "state=\"" + state + "\"");
      (void)PersistWorker(w);
      events_.Publish("worker", w.ToJson(now, MeshesOfWorker(id)));
      std::fprintf(stderr, "worker %s is %s (no heartbeat for %lld ms)\n", id.c_str(),
                   state.c_str(), static_cast<long long>(age));
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
    return it != jobs_.end() && (it->second.state == "queued" || it->second.state == "running");
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

// ---------------------------------------------------------------- workers

Result<Json> Service::RegisterWorker(const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(auto host, OptionalString(body, "host"));
  ASSIGN_OR_RETURN(auto data_port, OptionalInt(body, "data_port"));
  ASSIGN_OR_RETURN(auto local_port, RequiredInt(body, "local_port"));
  ASSIGN_OR_RETURN(auto devices, OptionalInt(body, "devices"));
  ASSIGN_OR_RETURN(auto name, OptionalString(body, "name"));
  ASSIGN_OR_RETURN(auto id, OptionalString(body, "id"));
  if (local_port < 1 || local_port > 65535) {
    return InvalidArgument("local_port must be 1..65535", {{"field", "local_port"}});
  }
  if (data_port && (*data_port < 0 || *data_port > 65535)) {
    return InvalidArgument("data_port must be 0..65535", {{"field", "data_port"}});
  }
  if (devices && (*devices < 1 || *devices > 4096)) {
    return InvalidArgument("devices must be 1..4096", {{"field", "devices"}});
  }
  std::string wid;
  if (id) {
    RETURN_IF_ERROR(ValidateName(*id, "id"));
    wid = *id;  // re-registration after a tesserad restart keeps the id
  } else if (name) {
    RETURN_IF_ERROR(ValidateName(*name, "name"));
    wid = "w-" + *name;
  } else {
    wid = NewId("w");
  }
  MutexLock lock(mu_);
  const int64_t now = WallMs();
  auto [it, inserted] = workers_.try_emplace(wid);
  WorkerRecord& w = it->second;
  if (inserted) {
    worker_order_.push_back(wid);
    w.registered_ms = now;
  }
  w.id = wid;
  w.host = host.value_or("127.0.0.1");
  w.data_port = static_cast<int>(data_port.value_or(0));
  w.local_port = static_cast<int>(local_port);
  w.devices = static_cast<int>(devices.value_or(1));
  w.state = "alive";
  w.beat->alive = true;
  w.beat->Touch(MonoMs());
  {
    MutexLock beats(beats_mu_);
    beats_[wid] = w.beat;
  }
  (void)PersistWorker(w);
  events_.Publish("worker", w.ToJson(MonoMs(), MeshesOfWorker(wid)));
  cv_.NotifyAll();
  std::fprintf(stderr, "worker %s registered (%s, local port %d, %d devices)\n", wid.c_str(),
               w.host.c_str(), w.local_port, w.devices);
  Json reply = {{"id", wid}, {"heartbeat_ms", options_.heartbeat_ms}, {"lease_ms", options_.lease_ms},
                {"checkpoint_root", options_.checkpoint_root}};
  if (!options_.s3_endpoint.empty()) reply["s3_endpoint"] = options_.s3_endpoint;
  return reply;
}

Result<Json> Service::Heartbeat(const std::string& id) {
  std::shared_ptr<WorkerBeat> beat;
  {
    MutexLock beats(beats_mu_);
    auto it = beats_.find(id);
    if (it != beats_.end()) beat = it->second;
  }
  if (beat == nullptr) {
    return NotFound("unknown worker " + id + "; register again", {{"worker", id}});
  }
  const int64_t now = MonoMs();
  beat->Touch(now);
  // The common case ends here, without mu_; a suspect or dead worker is revived.
  if (!beat->alive.load()) {
    MutexLock lock(mu_);
    auto it = workers_.find(id);
    if (it != workers_.end() && it->second.state != "alive") {
      WorkerRecord& w = it->second;
      w.state = "alive";
      w.beat->alive = true;
      (void)PersistWorker(w);
      events_.Publish("worker", w.ToJson(now, MeshesOfWorker(id)));
      cv_.NotifyAll();
    }
  }
  return Json{{"state", "alive"}, {"heartbeat_ms", options_.heartbeat_ms}};
}

Result<Json> Service::PollTasks(const std::string& id, int64_t wait_ms) {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return NotFound("unknown worker " + id, {{"worker", id}});
  wait_ms = std::clamp<int64_t>(wait_ms, 0, options_.max_wait_ms);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  // Hold the worker's wakeup: the record may be erased (DeleteWorker) while we wait.
  std::shared_ptr<CondVar> wake = it->second.task_cv;
  const uint64_t mine = ++polls_;
  it->second.poll = mine;
  wake->NotifyAll();  // an older poll of this worker gives way now
  ++polls_waiting_;
  ++it->second.polls_waiting;
  while (true) {
    auto w = workers_.find(id);
    if (stopping_ || w == workers_.end() || w->second.poll != mine || !w->second.tasks.empty()) break;
    if (!wake->WaitUntil(mu_, deadline)) break;
  }
  --polls_waiting_;
  if (auto w = workers_.find(id); w != workers_.end() && w->second.polls_waiting > 0) {
    --w->second.polls_waiting;
  }
  it = workers_.find(id);
  Json tasks = Json::array();
  if (it != workers_.end() && it->second.poll == mine) {
    it->second.beat->Touch(MonoMs() - wait_ms);
    while (!it->second.tasks.empty()) {
      Json& task = it->second.tasks.front();
      // Delivered is running: the worker reports only the outcome and progress.
      auto j = task_jobs_.find(task.value("id", ""));
      if (j != task_jobs_.end()) {
        auto t = jobs_.at(j->second).tasks.find(j->first);
        if (t != jobs_.at(j->second).tasks.end() && t->second.state == "queued") {
          t->second.state = "running";
        }
      }
      tasks.push_back(std::move(task));
      it->second.tasks.pop_front();
    }
  }
  return Json{{"tasks", tasks}};
}

Status Service::ReportTask(const std::string& worker, const std::string& task, const Json& body) {
  ASSIGN_OR_RETURN(TaskReport report, TaskReportFromJson(body));
  MutexLock lock(mu_);
  auto owner = task_jobs_.find(task);
  if (owner == task_jobs_.end()) {
    // A late report of a task whose job has ended or moved on is harmless.
    if (retired_tasks_.count(task)) return Status::Ok();
    return NotFound("unknown task " + task, {{"task", task}});
  }
  JobRecord& job = jobs_.at(owner->second);
  auto t = job.tasks.find(task);
  if (t == job.tasks.end()) return NotFound("unknown task " + task, {{"task", task}});
  if (t->second.worker != worker) {
    return InvalidArgument("task " + task + " belongs to worker " + t->second.worker,
                           {{"field", "task"}});
  }
  if (job.finished()) return Status::Ok();  // late report of an ended job
  TaskState& ts = t->second;
  const bool ended = report.state != ReportState::kRunning;
  ts.state = std::string(ReportStateName(report.state));
  if (report.done_bytes > 0 || report.total_bytes > 0) {
    const uint64_t before = ts.done_bytes;
    ts.done_bytes = report.done_bytes;
    ts.total_bytes = report.total_bytes;
    job.done_bytes += ts.done_bytes - std::min(before, ts.done_bytes);
    if (job.total_bytes) job.done_bytes = std::min(job.done_bytes, job.total_bytes);
  }
  if (!report.result.is_null()) ts.result = report.result;
  if (!report.error.ok()) ts.error = ErrorBody(report.error)["error"];
  // Events at most every 100 ms per job (a phase change publishes anyway): a
  // report of each of N workers must not cost N² of JSON.
  if (report.state == ReportState::kFailed || WallMs() - job.published_ms >= 100) PublishJob(job);
  if (ended) cv_.NotifyAll();
  return Status::Ok();
}

Json Service::ListWorkers() {
  MutexLock lock(mu_);
  Json out = Json::array();
  const int64_t now = MonoMs();
  for (const auto& id : worker_order_) {
    out.push_back(workers_.at(id).ToJson(now, MeshesOfWorker(id)));
  }
  return out;
}

Result<Json> Service::GetWorker(const std::string& id) {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return NotFound("no worker " + id, {{"worker", id}});
  return it->second.ToJson(MonoMs(), MeshesOfWorker(id));
}

Status Service::DeleteWorker(const std::string& id) {
  MutexLock lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return NotFound("no worker " + id, {{"worker", id}});
  if (WorkerBusy(id)) {
    return Conflict("worker " + id + " is in a running job", {{"worker", id}});
  }
  it->second.task_cv->NotifyAll();
  workers_.erase(it);
  {
    MutexLock beats(beats_mu_);
    beats_.erase(id);
  }
  worker_order_.erase(std::remove(worker_order_.begin(), worker_order_.end(), id),
                      worker_order_.end());
  RETURN_IF_ERROR(catalog_->Delete("workers", id));
  events_.Publish("worker", {{"id", id}, {"state", "deregistered"}});
  return Status::Ok();
}

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
      if (w->second.state != "alive") {
        return Unavailable("worker " + id + " is " + w->second.state, {{"worker", id}});
      }
      if (std::count(wanted.begin(), wanted.end(), id) > 1) {
        return InvalidArgument("worker " + id + " is listed twice", {{"field", "workers"}});
      }
    }
    chosen = wanted;
  } else {
    for (const auto& id : worker_order_) {
      if (static_cast<int64_t>(chosen.size()) == need) break;
      if (workers_.at(id).state == "alive") chosen.push_back(id);
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
  mu_.unlock();
  Status st = RunMeshInit(job_id);
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

void Service::Launch(const std::string& job_id, Status (Service::*run)(const std::string&)) {
  job_threads_.Spawn([this, job_id, run] {
    Status st = (this->*run)(job_id);
    (void)st;  // the job record carries the outcome
  });
}

Json Service::Cluster() {
  Json coordination = coordination_->Counts();
  MutexLock lock(mu_);
  Json workers = {{"alive", 0}, {"suspect", 0}, {"dead", 0}};
  for (const auto& [id, w] : workers_) workers[w.state] = workers[w.state].get<int>() + 1;
  Json jobs = Json::object();
  for (const auto& [id, j] : jobs_) jobs[j.state] = jobs.value(j.state, 0) + 1;
  uint64_t stored = 0, logical = 0, committed = 0;
  for (const auto& [k, c] : checkpoints_) {
    if (c.state != "committed") continue;
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
    for (const auto& [id, w] : workers_) gauges["tessera_workers"]["state=\"" + w.state + "\""]++;
    for (const char* s : {"queued", "running", "succeeded", "failed", "cancelled"}) {
      for (const char* k : {"save", "restore", "verify"}) {
        gauges["tessera_jobs"]["state=\"" + std::string(s) + "\",kind=\"" + k + "\""] = 0;
      }
    }
    for (const auto& [id, j] : jobs_) {
      gauges["tessera_jobs"]["state=\"" + j.state + "\",kind=\"" + j.kind + "\""]++;
    }
    double committed = 0, stored = 0;
    for (const auto& [k, c] : checkpoints_) {
      if (c.state != "committed") continue;
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
