// A save as a state machine (JobMachine). Every worker writes its share at its
// snapshot, into the step's staging dir, and joins the save with what it wrote:
//   join: every rank's join (a REST save first pushes a snapshot task to each worker;
//         an in-loop save's joins come when the trainers call save())
//   → check the joins against the mesh and the plan every worker computed
//   → merge (I/O) → commit (I/O; no cancel from here on) → retention (I/O) → done.
// Any failure before the commit abandons the checkpoint (JobAction::kAbandonSave).
#pragma once

#include <map>
#include <set>

#include "service/job_machine.h"

namespace tessera::service {

class SaveMachine : public JobMachine {
 public:
  // `from_loop`: an in-loop save, whose workers join when their trainers call save();
  // otherwise (REST) the machine asks each worker to snapshot, or, with
  // request.wait_for_trainer, waits for the trainers' saves. Joins are awaited for
  // `join_wait_ms` (in-loop, wait_for_trainer) or the job's task timeout (REST).
  SaveMachine(JobSpec spec, SaveRequest request, bool from_loop, int64_t join_wait_ms);

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  Result<JobActions> OnIoDone(int64_t now, Json result) override;
  Result<JobActions> OnJoined(int64_t now, int64_t rank, const SaveJoinRequest& join) override;
  Status OnWorkerDead(const std::string& worker, int64_t silent_ms) override;
  Status OnDeadline() override;
  JobActions OnFailure(const Status& st) override;

 private:
  enum class Stage { kJoin, kMerge, kCommit, kRetention };
  // Every join is in: check them, then merge.
  Result<JobActions> Merge();
  std::vector<int64_t> MissingJoins() const;
  JobAction Progress(int64_t rank);
  int64_t JoinWaitMs() const;

  const SaveRequest request_;
  const bool from_loop_;
  const int64_t join_wait_ms_;
  Stage stage_ = Stage::kJoin;
  std::map<int64_t, SaveJoinRequest> joins_;
  uint64_t done_bytes_ = 0;   // what the joins say was written
  uint64_t total_bytes_ = 0;  // the state's logical bytes, from the first join
  std::vector<storage::PlannedSlice> plan_;
  std::set<int64_t> bases_;  // the joins' bases (SaveWritten::base)
  Json result_;
};

}  // namespace tessera::service
