// tesserad's workers: registration, heartbeats (which never wait for the service
// lock), task long-polls and reports, listing and removal.
#include <algorithm>
#include <cstdio>

#include "api/names.h"
#include "service/service.h"

namespace tessera::service {

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
  w.state = WorkerState::kAlive;
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
    if (it != workers_.end() && it->second.state != WorkerState::kAlive) {
      WorkerRecord& w = it->second;
      w.state = WorkerState::kAlive;
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
        if (t != jobs_.at(j->second).tasks.end() && t->second.state == TaskRunState::kQueued) {
          t->second.state = TaskRunState::kRunning;
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
  ts.state = report.state == ReportState::kRunning     ? TaskRunState::kRunning
             : report.state == ReportState::kSucceeded ? TaskRunState::kSucceeded
                                                       : TaskRunState::kFailed;
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
  if (ended) {
    const int64_t now = MonoMs();
    PostToJob(job.id, report.state == ReportState::kSucceeded
                          ? JobEvent::TaskSucceeded(now, ts.round, ts.rank, ts.result)
                          : JobEvent::TaskFailed(now, ts.round, ts.rank,
                                                 report.error.ok()
                                                     ? Internal("task failed without an error")
                                                     : report.error));
  }
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

}  // namespace tessera::service
