#include "service/job_registry.h"

#include <algorithm>
#include <chrono>

#include "api/clock.h"

namespace tessera::service {

namespace {

// Closes the current phase's timing at `now`.
void ClosePhase(JobRecord* job, int64_t now) {
  if (!job->phase.empty() && job->phase_started_ms) {
    job->timings[job->phase] = job->timings.value(job->phase, int64_t{0}) + now - job->phase_started_ms;
  }
  job->phase_started_ms = now;
}

}  // namespace

void JobRegistry::Publish(JobRecord& job) {
  job.published_ms = clock_->WallMs();
  events_->Publish("job", job.ToJson());
}

void JobRegistry::Load(JobRecord r) {
  MutexLock lock(mu_);
  if (r.id.empty() || jobs_.count(r.id)) return;
  // Catalogs written before jobs had a seq: their load order is their creation order.
  r.seq = std::max(r.seq, last_seq_ + 1);
  last_seq_ = r.seq;
  order_.emplace(r.seq, r.id);
  finished_[r.mesh].push_back(r.id);
  r.Seal();
  const std::string id = r.id;
  jobs_[id] = std::move(r);
}

JobRecord JobRegistry::Create(const std::string& id, const std::string& kind,
                              const std::string& mesh, int64_t step, const Json& request,
                              std::optional<SaveRequest> join) {
  MutexLock lock(mu_);
  JobRecord& j = jobs_[id];
  j.id = id;
  j.seq = ++last_seq_;
  j.kind = kind;
  j.mesh = mesh;
  j.step = step;
  j.request = request;
  j.created_ms = clock_->WallMs();
  order_.emplace(j.seq, id);
  inboxes_[id] = std::make_shared<JobInbox>(clock_);
  if (join) joins_[id] = SaveTerms{std::move(*join), request.value("joined", false)};
  return j;
}

void JobRegistry::Announce(const std::string& id) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it != jobs_.end()) Publish(it->second);
}

void JobRegistry::Forget(const std::string& id) {
  MutexLock lock(mu_);
  ForgetLocked(id);
}

void JobRegistry::ForgetLocked(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  for (const auto& [tid, t] : it->second.tasks) RetireTask(tid);
  order_.erase(it->second.seq);
  inboxes_.erase(id);
  joins_.erase(id);
  jobs_.erase(it);
}

void JobRegistry::RetireTask(const std::string& task) {
  task_jobs_.erase(task);
  if (!retired_.insert(task).second) return;
  retired_order_.push_back(task);
  while (retired_order_.size() > kRetiredTasks) {
    retired_.erase(retired_order_.front());
    retired_order_.pop_front();
  }
}

std::pair<JobRecord, std::shared_ptr<JobInbox>> JobRegistry::Begin(const std::string& id) {
  MutexLock lock(mu_);
  JobRecord& job = jobs_.at(id);
  job.state = JobState::kRunning;
  job.started_ms = clock_->WallMs();
  Publish(job);
  return {job, inboxes_.at(id)};
}

JobRecord JobRegistry::SetPhase(const std::string& id, const std::string& phase) {
  MutexLock lock(mu_);
  JobRecord& job = jobs_.at(id);
  ClosePhase(&job, clock_->WallMs());
  job.phase = phase;
  Publish(job);
  return job;
}

std::vector<std::pair<std::string, Json>> JobRegistry::NewRound(
    const std::string& id, const std::vector<std::string>& workers, const JobAction& round) {
  MutexLock lock(mu_);
  JobRecord& job = jobs_.at(id);
  for (const auto& [tid, t] : job.tasks) RetireTask(tid);
  job.tasks.clear();
  job.done_bytes = 0;
  job.total_bytes = round.total_bytes;
  std::vector<std::pair<std::string, Json>> out;
  for (const auto& [rank, task] : round.tasks) {
    const std::string& wid = workers.at(rank);
    Task t = task;
    t.id = NewId("t");
    t.job = id;
    TaskState ts;
    ts.worker = wid;
    ts.rank = rank;
    ts.round = round.round;
    job.tasks[t.id] = ts;
    task_jobs_[t.id] = id;
    out.emplace_back(wid, TaskToJson(t));
  }
  Publish(job);
  return out;
}

JobRegistry::Ended JobRegistry::Finish(const std::string& id, const Status& status, Json result) {
  MutexLock lock(mu_);
  JobRecord& job = jobs_.at(id);
  for (auto& [tid, t] : job.tasks) {
    RetireTask(tid);
    t.result = nullptr;  // consumed by the job; an ended job keeps only its states
  }
  ClosePhase(&job, clock_->WallMs());
  job.ended_ms = clock_->WallMs();
  job.result = std::move(result);
  if (status.ok()) {
    job.state = JobState::kSucceeded;
    job.phase = "done";
    job.done_bytes = job.total_bytes;
  } else {
    job.state = IsCancelled(status) ? JobState::kCancelled : JobState::kFailed;
    job.error = ErrorBody(status)["error"];
  }
  Publish(job);
  auto join = joins_.find(id);
  Ended out{job, join != joins_.end() && join->second.request.wait_for_trainer};
  if (join != joins_.end()) joins_.erase(join);
  job.Seal();
  inboxes_.erase(id);
  finished_[job.mesh].push_back(id);
  ended_.NotifyAll();
  return out;
}

Status JobRegistry::Report(const std::string& worker, const std::string& task,
                           const TaskReport& report) {
  MutexLock lock(mu_);
  auto owner = task_jobs_.find(task);
  if (owner == task_jobs_.end()) {
    // A late report of a task whose job has ended or moved on is harmless.
    if (retired_.count(task)) return Status::Ok();
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
  if (report.state != ReportState::kRunning) {
    const int64_t now = clock_->MonoMs();
    auto inbox = inboxes_.find(job.id);
    if (inbox != inboxes_.end()) {
      inbox->second->Post(
          report.state == ReportState::kSucceeded
              ? JobEvent::TaskSucceeded(now, ts.round, ts.rank, ts.result)
              : JobEvent::TaskFailed(now, ts.round, ts.rank,
                                     report.error.ok() ? Internal("task failed without an error")
                                                       : report.error));
    }
  }
  // Events at most every 100 ms per job (a phase change publishes anyway): a report
  // of each of N workers must not cost N² of JSON.
  if (report.state == ReportState::kFailed || clock_->WallMs() - job.published_ms >= 100) Publish(job);
  return Status::Ok();
}

void JobRegistry::MarkDelivered(const std::vector<Json>& tasks) {
  MutexLock lock(mu_);
  for (const Json& task : tasks) {
    auto j = task_jobs_.find(task.value("id", ""));
    if (j == task_jobs_.end()) continue;
    auto& job_tasks = jobs_.at(j->second).tasks;
    auto t = job_tasks.find(j->first);
    if (t != job_tasks.end() && t->second.state == TaskRunState::kQueued) {
      t->second.state = TaskRunState::kRunning;
    }
  }
}

void JobRegistry::Progress(const std::string& id, uint64_t done, uint64_t total) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.finished()) return;
  it->second.done_bytes = done;
  it->second.total_bytes = total;
  Publish(it->second);
}

void JobRegistry::SaveProgress(const std::string& id, uint64_t done, uint64_t total,
                               const std::vector<std::string>& workers,
                               const std::map<int64_t, uint64_t>& joined, bool complete) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.finished()) return;
  JobRecord& job = it->second;
  if (job.joins.empty()) {
    for (const std::string& w : workers) job.joins.push_back({w, std::nullopt});
  }
  for (const auto& [rank, bytes] : joined) {
    if (rank >= 0 && static_cast<size_t>(rank) < job.joins.size()) job.joins[rank].written = bytes;
  }
  job.done_bytes = done;
  job.total_bytes = total;
  if (complete || clock_->WallMs() - job.published_ms >= 100) Publish(job);
}

void JobRegistry::Post(const std::string& id, JobEvent e) {
  MutexLock lock(mu_);
  auto it = inboxes_.find(id);
  if (it != inboxes_.end()) it->second->Post(std::move(e));
}

void JobRegistry::PostAll(const JobEvent& e) {
  MutexLock lock(mu_);
  for (auto& [id, inbox] : inboxes_) inbox->Post(e);
}

bool JobRegistry::Running(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  return it != jobs_.end() &&
         (it->second.state == JobState::kQueued || it->second.state == JobState::kRunning);
}

std::optional<JobRegistry::SaveTerms> JobRegistry::JoinOf(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = joins_.find(id);
  if (it == joins_.end()) return std::nullopt;
  return it->second;
}

int64_t JobRegistry::StartedMs(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? 0 : it->second.started_ms;
}

int64_t JobRegistry::EndedMs(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? 0 : it->second.ended_ms;
}

Result<Json> JobRegistry::Get(const std::string& id, int64_t wait_ms) {
  MutexLock lock(mu_);
  if (!jobs_.count(id)) return NotFound("no job " + id, {{"job", id}});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (!stopping_ && jobs_.count(id) && !jobs_.at(id).finished()) {
    if (!ended_.WaitUntil(mu_, deadline)) break;
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + id + " (no longer in the job history)", {{"job", id}});
  return it->second.ToJson();
}

Result<Json> JobRegistry::Cancel(const std::string& id) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + id, {{"job", id}});
  if (it->second.finished()) {
    return Conflict("job " + id + " has already " + StateString(it->second.state), {{"job", id}});
  }
  auto inbox = inboxes_.find(id);
  if (inbox != inboxes_.end()) inbox->second->Post(JobEvent::Cancel(clock_->MonoMs()));
  return it->second.ToJson();
}

Result<JobPage> JobRegistry::List(const std::string& state, const std::string& kind,
                                  const std::string& mesh, int64_t limit, uint64_t before) const {
  if (limit < 1 || limit > kMaxJobsPage) {
    return InvalidArgument("limit must be 1.." + std::to_string(kMaxJobsPage) + "; page with before=",
                           {{"field", "limit"}});
  }
  std::vector<std::shared_ptr<const std::string>> texts;
  JobPage page;
  {
    MutexLock lock(mu_);
    auto it = before > 0 ? order_.lower_bound(before) : order_.end();
    while (it != order_.begin() && static_cast<int64_t>(texts.size()) < limit) {
      --it;
      const JobRecord& j = jobs_.at(it->second);
      if ((!state.empty() && StateName(j.state) != state) || (!kind.empty() && j.kind != kind) ||
          (!mesh.empty() && j.mesh != mesh)) {
        continue;
      }
      texts.push_back(j.sealed ? j.sealed
                               : std::make_shared<const std::string>(j.ToJson().dump(
                                     -1, ' ', false, Json::error_handler_t::replace)));
      page.last_seq = j.seq;
    }
  }
  size_t bytes = 2;
  for (const auto& t : texts) bytes += t->size() + 1;
  page.json.reserve(bytes);
  page.json += '[';
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i) page.json += ',';
    page.json += *texts[i];
  }
  page.json += ']';
  page.count = texts.size();
  return page;
}

std::vector<std::string> JobRegistry::Prune(int64_t per_mesh, int64_t cutoff_ms) {
  MutexLock lock(mu_);
  std::vector<std::string> gone;
  for (auto m = finished_.begin(); m != finished_.end();) {
    std::deque<std::string>& ids = m->second;
    while (ids.size() > static_cast<size_t>(std::max<int64_t>(0, per_mesh))) {
      auto it = jobs_.find(ids.front());
      if (it != jobs_.end() && it->second.ended_ms > cutoff_ms) break;  // newer than the age kept
      ForgetLocked(ids.front());
      gone.push_back(std::move(ids.front()));
      ids.pop_front();
    }
    m = ids.empty() ? finished_.erase(m) : std::next(m);
  }
  return gone;
}

std::map<std::string, std::map<std::string, int64_t>> JobRegistry::Count() const {
  MutexLock lock(mu_);
  std::map<std::string, std::map<std::string, int64_t>> out;
  for (const auto& [id, j] : jobs_) out[StateString(j.state)][j.kind]++;
  return out;
}

void JobRegistry::Stop() {
  MutexLock lock(mu_);
  stopping_ = true;
  for (auto& [id, inbox] : inboxes_) inbox->Post(JobEvent::Stop(clock_->MonoMs()));
  ended_.NotifyAll();
}

}  // namespace tessera::service
