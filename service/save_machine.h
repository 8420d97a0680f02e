// A save as a state machine (JobMachine):
//   snapshot: a task per rank (REST), or every rank's create-or-join (in-loop)
//   → plan, create the staging dir (I/O) → write: a task per rank
//   → merge (I/O) → commit (I/O; no cancel from here on) → retention (I/O) → done.
// Any failure before the commit abandons the checkpoint (JobAction::kAbandonSave).
#pragma once

#include <map>

#include "service/job_machine.h"

namespace tessera::service {

class SaveMachine : public JobMachine {
 public:
  // `joined`: the workers bring their snapshots with their create-or-join, within
  // `join_wait_ms` of the job's start; otherwise snapshot tasks take them.
  SaveMachine(JobSpec spec, SaveRequest request, bool joined, int64_t join_wait_ms);

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  Result<JobActions> OnTasksDone(int64_t now, std::map<int64_t, Json> results) override;
  Result<JobActions> OnIoDone(int64_t now, Json result) override;
  Result<JobActions> OnJoined(int64_t now, int64_t rank, SnapshotResult snapshot) override;
  Status OnWorkerDead(const std::string& worker, int64_t silent_ms) override;
  Status OnDeadline() override;
  JobActions OnFailure(const Status& st) override;

 private:
  enum class Stage { kSnapshot, kStaging, kWrite, kMerge, kCommit, kRetention };
  // The snapshots are in: check them, plan the writes, create the staging dir.
  Result<JobActions> Plan(const std::map<int64_t, SnapshotResult>& snapshots);
  std::vector<int64_t> MissingJoins() const;

  const SaveRequest request_;
  const bool joined_;
  const int64_t join_wait_ms_;
  Stage stage_ = Stage::kSnapshot;
  std::map<int64_t, SnapshotResult> joins_;
  std::vector<TensorMeta> metas_;
  std::vector<storage::PlannedSlice> plan_;
  Json result_;
};

}  // namespace tessera::service
