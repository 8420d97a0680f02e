// The job engine: a job's phases and timings, its end, and the tasks it hands to the
// workers of its mesh (RunTasks waits for them, for a dead worker, a cancel or a timeout).
#include <algorithm>

#include "service/service.h"

namespace tessera::service {
namespace {

// Closes the current phase's timing.
void ClosePhase(JobRecord* job) {
  const int64_t now = WallMs();
  if (!job->phase.empty() && job->phase_started_ms) {
    job->timings[job->phase] = job->timings.value(job->phase, int64_t{0}) + now - job->phase_started_ms;
  }
  job->phase_started_ms = now;
}

}  // namespace

JobRecord& Service::BeginJob(const std::string& job_id) {
  JobRecord& job = jobs_.at(job_id);
  job.state = "running";
  job.started_ms = WallMs();
  (void)PersistJob(job);
  PublishJob(job);
  return job;
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
  for (auto& [tid, t] : job.tasks) {
    RetireTask(tid);
    t.result = nullptr;  // consumed by the job; an ended job keeps only its states
  }
  ClosePhase(&job);
  job.ended_ms = WallMs();
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
  job.Seal();
  active_jobs_.erase(job.id);
  finished_jobs_[job.mesh].push_back(job.id);
  cv_.NotifyAll();
  std::fprintf(stderr, "job %s (%s %s step %lld) %s%s\n", job.id.c_str(), job.kind.c_str(),
               job.mesh.c_str(), static_cast<long long>(job.step), job.state.c_str(),
               status.ok() ? "" : (": " + status.message()).c_str());
}

Result<std::map<int64_t, Json>> Service::RunTasks(const std::string& job_id,
                                                  const std::vector<std::string>& workers,
                                                  std::map<int64_t, Task> tasks,
                                                  uint64_t total_bytes, int64_t timeout_ms) {
  {
    JobRecord& job = jobs_.at(job_id);
    for (const auto& [tid, t] : job.tasks) RetireTask(tid);
    job.tasks.clear();
    job.done_bytes = 0;
    job.total_bytes = total_bytes;
    for (auto& [rank, task] : tasks) {
      const std::string& wid = workers.at(rank);
      auto w = workers_.find(wid);
      if (w == workers_.end() || w->second.state == "dead") {
        return Unavailable("worker " + wid + " (rank " + std::to_string(rank) + ") is " +
                               (w == workers_.end() ? "not registered" : "dead"),
                           {{"worker", wid}, {"rank", rank}});
      }
      const std::string tid = NewId("t");
      task.id = tid;
      task.job = job_id;
      TaskState ts;
      ts.worker = wid;
      ts.rank = rank;
      job.tasks[tid] = ts;
      task_jobs_[tid] = job_id;
      QueueTask(&w->second, task);
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
        Status st = StatusFromErrorJson(t.error, "task failed without an error");
        return st.WithContext(who()).WithDetail("worker", t.worker).WithDetail("rank", t.rank);
      }
      auto w = workers_.find(t.worker);
      if (w == workers_.end() || w->second.state == "dead") {
        int64_t age = w == workers_.end() ? 0 : MonoMs() - w->second.last_heartbeat_mono_ms();
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

void Service::AbortOnWorkers(const MeshRecord& mesh, const std::string& job_id, bool collective,
                             const Status& error) {
  Task abort;
  abort.job = job_id;
  abort.kind = TaskKind::kAbort;
  if (collective) {
    abort.mesh_name = mesh.mesh.name;
    abort.error = error;
  }
  for (const auto& wid : mesh.workers) {
    auto w = workers_.find(wid);
    if (w == workers_.end() || w->second.state == "dead") continue;
    abort.id = NewId("t");
    QueueTask(&w->second, abort);
  }
  cv_.NotifyAll();
}

}  // namespace tessera::service
