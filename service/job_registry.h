// Jobs as records: each job's record and tasks, the inbox its loop reads (job_inbox.h),
// the order jobs were created in (GET /api/v1/jobs pages by it) and the history
// policy's queue of finished jobs. One lock, held for memory alone: the caller writes
// the catalog with the copies these methods return. Job events are published under
// the lock, so that a job's events reach subscribers in the order of its changes.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "api/requests.h"
#include "api/status.h"
#include "api/task_protocol.h"
#include "api/thread_annotations.h"
#include "service/events.h"
#include "service/job_inbox.h"
#include "service/job_machine.h"
#include "service/records.h"

namespace tessera::service {

// GET /api/v1/jobs answers at most this many jobs a page.
inline constexpr int64_t kMaxJobsPage = 1000;

// A page of GET /api/v1/jobs: the JSON array is put together outside the lock from
// the text of ended jobs.
struct JobPage {
  std::string json;
  size_t count = 0;
  uint64_t last_seq = 0;  // of the last job listed: the next page's `before`
};

class JobRegistry {
 public:
  // Times (records' and events') come from `clock`.
  JobRegistry(EventBus* events, Clock* clock) : events_(events), clock_(clock) {}

  // A job from the catalog, ended (one that was running is failed by the caller first).
  void Load(JobRecord r);
  // A new queued job and its inbox; `join`: a save's request, which the workers'
  // joins are checked against (wait_for_trainer: its trainers' saves join it, and
  // its workers hear of its end). Its first event goes out with Announce, once its record is
  // written (a job undone with Forget before that was never seen).
  JobRecord Create(const std::string& id, const std::string& kind, const std::string& mesh,
                   int64_t step, const Json& request,
                   std::optional<SaveRequest> join = std::nullopt);
  void Announce(const std::string& id);
  void Forget(const std::string& id);  // a job that never started (its record was not written)

  // Marks the job running: its record and its inbox.
  std::pair<JobRecord, std::shared_ptr<JobInbox>> Begin(const std::string& id);
  JobRecord SetPhase(const std::string& id, const std::string& phase);
  // A new round of the job's tasks: each task (to `workers[rank]`) gets an id and is
  // recorded; the tasks to queue, by worker.
  std::vector<std::pair<std::string, Json>> NewRound(const std::string& id,
                                                     const std::vector<std::string>& workers,
                                                     const JobAction& round);
  struct Ended {
    JobRecord record;    // as it ended, sealed
    bool joined = false;  // a save its trainers joined: its workers are told of the end
  };
  Ended Finish(const std::string& id, const Status& status, Json result);

  // A worker's report of a task; an ended task goes to its job's inbox. not_found for a
  // task never known (a late report of an ended one is fine). The job's event goes
  // out at most every 100 ms a job, and on a failure.
  Status Report(const std::string& worker, const std::string& task, const TaskReport& report);
  void MarkDelivered(const std::vector<Json>& tasks);  // queued → running
  void Progress(const std::string& id, uint64_t done, uint64_t total);  // a verify's, a save's
  // A save's progress: `joined` (rank → bytes written) added to its workers' joins.
  // Published at most every 100 ms, and when every worker has joined (`complete`).
  void SaveProgress(const std::string& id, uint64_t done, uint64_t total,
                    const std::vector<std::string>& workers,
                    const std::map<int64_t, uint64_t>& joined, bool complete);
  void Post(const std::string& id, JobEvent e);  // to a running job; none once ended
  void PostAll(const JobEvent& e);               // to every running job

  bool Running(const std::string& id) const;  // queued or running
  // A running save's request, and whether its trainers' saves started it (the job's
  // recorded request says "joined") rather than a REST call.
  struct SaveTerms {
    SaveRequest request;
    bool from_loop = false;
  };
  std::optional<SaveTerms> JoinOf(const std::string& id) const;
  int64_t StartedMs(const std::string& id) const;
  int64_t EndedMs(const std::string& id) const;  // 0: unknown, or not ended
  // The job, once finished or after `wait_ms`.
  Result<Json> Get(const std::string& id, int64_t wait_ms);
  Result<Json> Cancel(const std::string& id);  // the job's machine decides
  Result<JobPage> List(const std::string& state, const std::string& kind, const std::string& mesh,
                       int64_t limit, uint64_t before) const;
  // Drops finished jobs beyond the last `per_mesh` of each mesh that ended before
  // `cutoff_ms`; their ids (for the catalog).
  std::vector<std::string> Prune(int64_t per_mesh, int64_t cutoff_ms);
  // Jobs by state, then kind.
  std::map<std::string, std::map<std::string, int64_t>> Count() const;
  void Stop();  // every job's loop hears of it; waits end

 private:
  void RetireTask(const std::string& task) REQUIRES(mu_);
  void ForgetLocked(const std::string& id) REQUIRES(mu_);
  void Publish(JobRecord& job) REQUIRES(mu_);

  EventBus* const events_;
  Clock* const clock_;
  mutable Mutex mu_;
  CondVar ended_;  // a job ended (GetJob waits on it)
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, JobRecord> jobs_ GUARDED_BY(mu_);
  std::map<std::string, std::string> task_jobs_ GUARDED_BY(mu_);  // running task → job
  std::map<std::string, std::shared_ptr<JobInbox>> inboxes_ GUARDED_BY(mu_);  // running jobs
  std::map<std::string, SaveTerms> joins_ GUARDED_BY(mu_);  // running saves
  std::map<uint64_t, std::string> order_ GUARDED_BY(mu_);     // by JobRecord::seq
  uint64_t last_seq_ GUARDED_BY(mu_) = 0;
  // Finished jobs of each mesh, in the order they ended: what the history policy prunes.
  std::map<std::string, std::deque<std::string>> finished_ GUARDED_BY(mu_);
  // Tasks that ended (the newest kRetiredTasks), so late reports need no search.
  static constexpr size_t kRetiredTasks = 65536;
  std::unordered_set<std::string> retired_ GUARDED_BY(mu_);
  std::deque<std::string> retired_order_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
