// Jobs as records: creation, queries (paged, newest first), cancellation, and the
// history policy that keeps them bounded. A finished job is kept while it is one
// of the last ServiceOptions::job_history_per_mesh finished jobs of its mesh, or
// ended less than job_history_min_age_ms ago; the rest go from memory and from
// the catalog, in one transaction written outside mu_.
#include <algorithm>

#include "service/job_inbox.h"
#include "service/service.h"

namespace tessera::service {

Result<Service::JobPage> Service::ListJobs(const std::string& state, const std::string& kind,
                                           const std::string& mesh, int64_t limit,
                                           uint64_t before) {
  if (limit < 1 || limit > kMaxJobsPage) {
    return InvalidArgument("limit must be 1.." + std::to_string(kMaxJobsPage) + "; page with before=",
                           {{"field", "limit"}});
  }
  std::vector<std::shared_ptr<const std::string>> texts;
  JobPage page;
  {
    MutexLock lock(mu_);
    auto it = before > 0 ? job_order_.lower_bound(before) : job_order_.end();
    while (it != job_order_.begin() && static_cast<int64_t>(texts.size()) < limit) {
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

Result<Json> Service::GetJob(const std::string& id, int64_t wait_ms) {
  MutexLock lock(mu_);
  if (!jobs_.count(id)) return NotFound("no job " + id, {{"job", id}});
  wait_ms = std::clamp<int64_t>(wait_ms, 0, options_.max_wait_ms);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (!stopping_ && jobs_.count(id) && !jobs_.at(id).finished()) {
    if (!cv_.WaitUntil(mu_, deadline)) break;
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + id + " (no longer in the job history)", {{"job", id}});
  return it->second.ToJson();
}

Result<Json> Service::CancelJob(const std::string& id) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + id, {{"job", id}});
  if (it->second.finished()) {
    return Conflict("job " + id + " has already " + StateString(it->second.state), {{"job", id}});
  }
  PostToJob(id, JobEvent::Cancel(MonoMs()));  // the job's machine decides
  return it->second.ToJson();
}

JobRecord* Service::NewJob(const std::string& kind, const std::string& mesh, int64_t step,
                           const Json& request) {
  JobRecord j;
  j.id = NewId("j");
  j.seq = ++last_job_seq_;
  j.kind = kind;
  j.mesh = mesh;
  j.step = step;
  j.request = request;
  j.created_ms = WallMs();
  job_order_.emplace(j.seq, j.id);
  active_jobs_.insert(j.id);
  inboxes_[j.id] = std::make_shared<JobInbox>();
  JobRecord& ref = jobs_[j.id] = std::move(j);
  (void)PersistJob(ref);
  PublishJob(ref);
  return &ref;
}

void Service::ForgetJob(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  for (const auto& [tid, t] : it->second.tasks) RetireTask(tid);
  job_order_.erase(it->second.seq);
  active_jobs_.erase(id);
  inboxes_.erase(id);
  jobs_.erase(it);
}

void Service::RetireTask(const std::string& task) {
  task_jobs_.erase(task);
  if (!retired_tasks_.insert(task).second) return;
  retired_order_.push_back(task);
  while (retired_order_.size() > kRetiredTasks) {
    retired_tasks_.erase(retired_order_.front());
    retired_order_.pop_front();
  }
}

void Service::PruneJobHistory() {
  std::vector<std::string> gone;
  {
    MutexLock lock(mu_);
    const int64_t cutoff = WallMs() - options_.job_history_min_age_ms;
    for (auto m = finished_jobs_.begin(); m != finished_jobs_.end();) {
      std::deque<std::string>& ids = m->second;
      while (ids.size() > static_cast<size_t>(std::max<int64_t>(0, options_.job_history_per_mesh))) {
        auto it = jobs_.find(ids.front());
        if (it != jobs_.end() && it->second.ended_ms > cutoff) break;  // newer than the age kept
        ForgetJob(ids.front());
        gone.push_back(std::move(ids.front()));
        ids.pop_front();
      }
      m = ids.empty() ? finished_jobs_.erase(m) : std::next(m);
    }
    pruned_jobs_ += gone.size();
  }
  if (gone.empty()) return;
  Status st = catalog_->DeleteMany("jobs", gone);
  if (!st.ok()) {
    // The rows stay behind; the next start of tesserad prunes them again.
    NoteCatalogFailure("jobs", st.WithContext("pruning " + std::to_string(gone.size()) +
                                              " jobs from the catalog"));
  }
}

}  // namespace tessera::service
