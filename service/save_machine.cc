#include "service/save_machine.h"

#include "service/save_job.h"

namespace tessera::service {

SaveMachine::SaveMachine(JobSpec spec, SaveRequest request, bool joined, int64_t join_wait_ms)
    : JobMachine(std::move(spec)),
      request_(std::move(request)),
      joined_(joined),
      join_wait_ms_(join_wait_ms) {}

Result<JobActions> SaveMachine::OnStart(int64_t now) {
  JobActions out{SetPhase("snapshot")};
  if (joined_) {
    WaitUntil(now + join_wait_ms_);
    return out;
  }
  std::map<int64_t, Task> snap;
  for (int64_t r = 0; r < spec_.mesh.mesh.num_workers(); ++r) {
    Task& t = snap[r] = MeshTask(TaskKind::kSnapshot, spec_.mesh.mesh, r);
    t.step = spec_.step;
    t.tensor_names = request_.tensors;
    t.wait_for_trainer = request_.wait_for_trainer;
  }
  out.push_back(QueueTasks(std::move(snap), 0, now, spec_.task_timeout_ms));
  return out;
}

Result<JobActions> SaveMachine::OnJoined(int64_t, int64_t rank, SnapshotResult snapshot) {
  if (!joined_ || stage_ != Stage::kSnapshot) return JobActions{};
  if (rank < 0 || rank >= spec_.mesh.mesh.num_workers()) return JobActions{};
  joins_.emplace(rank, std::move(snapshot));  // a repeated join changes nothing
  if (!MissingJoins().empty()) return JobActions{};
  return Plan(joins_);
}

std::vector<int64_t> SaveMachine::MissingJoins() const {
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < spec_.mesh.mesh.num_workers(); ++r) {
    if (!joins_.count(r)) missing.push_back(r);
  }
  return missing;
}

Result<JobActions> SaveMachine::Plan(const std::map<int64_t, SnapshotResult>& snapshots) {
  ASSIGN_OR_RETURN(metas_, CollectSnapshotTensors(spec_.mesh.mesh, spec_.mesh.workers, snapshots));
  plan_ = storage::PlanSave(spec_.mesh.mesh, metas_);
  stage_ = Stage::kStaging;
  return JobActions{RunIo(IoKind::kCreateStaging)};
}

Result<JobActions> SaveMachine::OnTasksDone(int64_t, std::map<int64_t, Json> results) {
  if (stage_ == Stage::kSnapshot) {
    std::map<int64_t, SnapshotResult> snapshots;
    for (const auto& [rank, res] : results) {
      auto snapshot = SnapshotResultFromJson(res);
      if (!snapshot.ok()) {
        const std::string& wid = spec_.mesh.workers.at(rank);
        return snapshot.status()
            .WithContext("snapshot of worker " + wid)
            .WithDetail("worker", wid)
            .WithDetail("rank", rank);
      }
      snapshots[rank] = std::move(*snapshot);
    }
    return Plan(snapshots);
  }
  stage_ = Stage::kMerge;
  return MergeWritten(results, "write");
}

Result<JobActions> SaveMachine::OnIoDone(int64_t now, Json result) {
  switch (stage_) {
    case Stage::kStaging: {
      std::map<int64_t, Task> writes;
      uint64_t total = 0;
      for (int64_t r = 0; r < spec_.mesh.mesh.num_workers(); ++r) {
        Task& t = writes[r] = MeshTask(TaskKind::kWrite, spec_.mesh.mesh, r);
        t.step = spec_.step;
        t.staging = spec_.staging;
        t.compress = request_.compress;
        t.level = request_.level;
      }
      for (const auto& p : plan_) {
        writes[p.rank].slices.push_back({metas_[p.tensor].name, p.device, p.slice});
        total += p.bytes;
      }
      stage_ = Stage::kWrite;
      return WriteRound(std::move(writes), total, now);
    }
    case Stage::kMerge: {
      stage_ = Stage::kCommit;
      return CommitStep(plan_);
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
    case Stage::kSnapshot:
    case Stage::kWrite:
      break;
  }
  return Internal("save job " + spec_.id + ": an I/O step ended in a stage without one");
}

Status SaveMachine::OnWorkerDead(const std::string& worker, int64_t silent_ms) {
  if (!joined_ || stage_ != Stage::kSnapshot) return Status::Ok();
  for (int64_t r : MissingJoins()) {
    if (spec_.mesh.workers[r] != worker) continue;
    return Unavailable("worker " + worker + " (rank " + std::to_string(r) +
                           ") is dead (no heartbeat for " + std::to_string(silent_ms) +
                           " ms); it had not joined the save of step " + std::to_string(spec_.step),
                       {{"worker", worker}, {"rank", r}});
  }
  return Status::Ok();
}

Status SaveMachine::OnDeadline() {
  if (!joined_ || stage_ != Stage::kSnapshot) return JobMachine::OnDeadline();
  const std::vector<int64_t> missing = MissingJoins();
  Json workers = Json::array();
  for (int64_t r : missing) workers.push_back(spec_.mesh.workers[r]);
  return DeadlineExceeded("the trainers of ranks " + Json(missing).dump() + " (workers " +
                              workers.dump() + ") did not call save(" +
                              std::to_string(spec_.step) + ") within " +
                              std::to_string(join_wait_ms_) + " ms of the first",
                          {{"missing_ranks", missing}, {"workers", workers}});
}

JobActions SaveMachine::OnFailure(const Status& st) {
  return {Cleanup(JobAction::Kind::kAbandonSave, st)};
}

}  // namespace tessera::service
