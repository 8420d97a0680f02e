#include "service/save_machine.h"

#include <algorithm>
#include <set>

#include "service/save_job.h"
#include "storage/checkpoint_dir.h"

namespace tessera::service {

SaveMachine::SaveMachine(JobSpec spec, SaveRequest request, bool from_loop, int64_t join_wait_ms)
    : JobMachine(std::move(spec)),
      request_(std::move(request)),
      from_loop_(from_loop),
      join_wait_ms_(join_wait_ms) {}

int64_t SaveMachine::JoinWaitMs() const {
  return from_loop_ || request_.wait_for_trainer ? join_wait_ms_ : spec_.task_timeout_ms;
}

Result<JobActions> SaveMachine::OnStart(int64_t now) {
  // Every worker listed as waiting for its join.
  JobActions out{SetPhase("write"), SetCheckpointState(CheckpointState::kWriting), Progress(-1)};
  if (!from_loop_ && !request_.wait_for_trainer) {
    std::map<int64_t, Task> snap;
    for (int64_t r = 0; r < spec_.mesh.mesh.num_workers(); ++r) {
      Task& t = snap[r] = MeshTask(TaskKind::kSnapshot, spec_.mesh.mesh, r);
      t.step = spec_.step;
      t.tensor_names = request_.tensors;
      t.staging = spec_.staging;
      t.compress = request_.compress;
      t.level = request_.level;
      t.full = request_.full;
      t.full_every = request_.full_every;
      t.from_memory = request_.from_memory;
    }
    out.push_back(SendTasks(std::move(snap)));
  }
  WaitUntil(now + JoinWaitMs());
  return out;
}

Result<JobActions> SaveMachine::OnJoined(int64_t, int64_t rank, const SaveJoinRequest& join) {
  if (stage_ != Stage::kJoin) return JobActions{};
  if (rank < 0 || rank >= spec_.mesh.mesh.num_workers()) return JobActions{};
  const std::string& wid = spec_.mesh.workers[rank];
  if (joins_.count(rank)) return JobActions{};  // a repeated join changes nothing
  if (!join.error.ok()) {
    return join.error.WithContext("the write of worker " + wid + " (rank " + std::to_string(rank) + ")")
        .WithDetail("worker", wid)
        .WithDetail("rank", rank);
  }
  joins_.emplace(rank, join);
  const bool all = static_cast<int64_t>(joins_.size()) == spec_.mesh.mesh.num_workers();
  if (!all) return JobActions{Progress(rank)};
  ASSIGN_OR_RETURN(JobActions merge, Merge());
  merge.insert(merge.begin(), Progress(rank));  // every worker joined
  return merge;
}

// The bytes the joins say were written, of the state's logical bytes (every snapshot
// describes the whole of each tensor), and the join of `rank` (-1: none yet). Only
// the new join goes in the action: the job's record keeps the others.
JobAction SaveMachine::Progress(int64_t rank) {
  JobAction a;
  a.kind = JobAction::Kind::kSetProgress;
  if (rank >= 0) {
    const SaveJoinRequest& join = joins_.at(rank);
    const uint64_t bytes = join.written ? join.written->bytes : 0;
    done_bytes_ += bytes;
    a.joined[rank] = bytes;
    if (total_bytes_ == 0) {
      for (const SnapshotTensor& t : join.snapshot.tensors) total_bytes_ += t.meta.logical_bytes();
    }
  }
  a.done_bytes = std::min(done_bytes_, total_bytes_);
  a.total_bytes = total_bytes_;
  a.complete = static_cast<int64_t>(joins_.size()) == spec_.mesh.mesh.num_workers();
  return a;
}

std::vector<int64_t> SaveMachine::MissingJoins() const {
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < spec_.mesh.mesh.num_workers(); ++r) {
    if (!joins_.count(r)) missing.push_back(r);
  }
  return missing;
}

Result<JobActions> SaveMachine::Merge() {
  std::map<int64_t, SnapshotResult> snapshots;
  for (const auto& [rank, join] : joins_) snapshots[rank] = join.snapshot;
  ASSIGN_OR_RETURN(std::vector<TensorMeta> metas,
                   CollectSnapshotTensors(spec_.mesh.mesh, spec_.mesh.workers, snapshots));
  plan_ = storage::PlanSave(spec_.mesh.mesh, metas);
  ASSIGN_OR_RETURN(auto fragments, CheckFragments(spec_.mesh, metas, plan_, joins_));
  stage_ = Stage::kMerge;
  for (const auto& [rank, join] : joins_) {
    if (join.written && join.written->base) bases_.insert(*join.written->base);
  }
  JobAction merge = RunIo(IoKind::kMerge);
  if (request_.from_memory) {
    // A persist: the memory checkpoint's metadata, which every worker's share carries.
    merge.io_input = {{"metadata", joins_.begin()->second.save.metadata}};
  }
  merge.slices = std::move(fragments);
  merge.bases = bases_;
  return JobActions{SetPhase("merge"), SetCheckpointState(CheckpointState::kMerging),
                    std::move(merge)};
}

Result<JobActions> SaveMachine::OnIoDone(int64_t, Json result) {
  switch (stage_) {
    case Stage::kMerge:
    {
      stage_ = Stage::kCommit;
      JobActions commit = CommitStep(plan_);
      commit.back().bases = bases_;
      return commit;
    }
    case Stage::kCommit:
      stage_ = Stage::kRetention;
      result_ = std::move(result);
      return JobActions{SetPhase("retention"), RunIo(IoKind::kRetention)};
    case Stage::kRetention:
      if (result.is_object() && result.contains("retention_error")) {
        result_["retention_error"] = result["retention_error"];
      }
      return JobActions{Finish(result_)};
    case Stage::kJoin:
      break;
  }
  return Internal("save job " + spec_.id + ": an I/O step ended in a stage without one");
}

Status SaveMachine::OnWorkerDead(const std::string& worker, int64_t silent_ms) {
  // From the commit on, the workers' part is done and durable.
  if (stage_ != Stage::kJoin && stage_ != Stage::kMerge) return Status::Ok();
  for (int64_t r = 0; r < spec_.mesh.mesh.num_workers(); ++r) {
    if (spec_.mesh.workers[r] != worker) continue;
    const bool joined = joins_.count(r) > 0;
    return Unavailable("worker " + worker + " (rank " + std::to_string(r) +
                           ") is dead (no heartbeat for " + std::to_string(silent_ms) + " ms); it " +
                           (joined ? "had joined" : "had not joined") + " the save of step " +
                           std::to_string(spec_.step),
                       {{"worker", worker}, {"rank", r}, {"joined", joined}});
  }
  return Status::Ok();
}

Status SaveMachine::OnDeadline() {
  if (stage_ != Stage::kJoin) return JobMachine::OnDeadline();
  const std::vector<int64_t> missing = MissingJoins();
  Json workers = Json::array();
  for (int64_t r : missing) workers.push_back(spec_.mesh.workers[r]);
  const std::string who = "ranks " + Json(missing).dump() + " (workers " + workers.dump() + ")";
  const std::string within = " within " + std::to_string(JoinWaitMs()) + " ms";
  return DeadlineExceeded(
      from_loop_ || request_.wait_for_trainer
          ? "the trainers of " + who + " did not call save(" + std::to_string(spec_.step) + ")" +
                within + (from_loop_ ? " of the first" : " of the save's start")
          : "the workers of " + who + " did not snapshot and write step " +
                std::to_string(spec_.step) + within,
      {{"missing_ranks", missing}, {"workers", workers}});
}

JobActions SaveMachine::OnFailure(const Status& st) {
  return {Cleanup(JobAction::Kind::kAbandonSave, st)};
}

}  // namespace tessera::service
