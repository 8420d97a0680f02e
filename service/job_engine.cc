// The job records the loops keep (job_loop.cc): a job's start, its phases and timings,
// its end, and the abort its workers are told of.
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
  job.state = JobState::kRunning;
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
    job.state = JobState::kSucceeded;
    job.phase = "done";
    job.done_bytes = job.total_bytes;
  } else if (IsCancelled(status)) {
    job.state = JobState::kCancelled;
    job.error = ErrorBody(status)["error"];
  } else {
    job.state = JobState::kFailed;
    job.error = ErrorBody(status)["error"];
  }
  (void)PersistJob(job);
  PublishJob(job);
  job.Seal();
  active_jobs_.erase(job.id);
  finished_jobs_[job.mesh].push_back(job.id);
  cv_.NotifyAll();
  std::fprintf(stderr, "job %s (%s %s step %lld) %s%s\n", job.id.c_str(), job.kind.c_str(),
               job.mesh.c_str(), static_cast<long long>(job.step), StateString(job.state).c_str(),
               status.ok() ? "" : (": " + status.message()).c_str());
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
    if (w == workers_.end() || w->second.state == WorkerState::kDead) continue;
    abort.id = NewId("t");
    QueueTask(&w->second, abort);
  }
  cv_.NotifyAll();
}

}  // namespace tessera::service
