#include "service/job_machine.h"

namespace tessera::service {

JobEvent JobEvent::Make(Kind kind, int64_t now) {
  JobEvent e;
  e.kind = kind;
  e.now_ms = now;
  return e;
}

JobEvent JobEvent::TaskSucceeded(int64_t now, int64_t round, int64_t rank, Json result) {
  JobEvent e = Make(Kind::kTaskEnded, now);
  e.round = round;
  e.rank = rank;
  e.result = std::move(result);
  return e;
}

JobEvent JobEvent::TaskFailed(int64_t now, int64_t round, int64_t rank, Status error) {
  JobEvent e = Make(Kind::kTaskEnded, now);
  e.round = round;
  e.rank = rank;
  e.ok = false;
  e.error = std::move(error);
  return e;
}

JobEvent JobEvent::WorkerDead(int64_t now, std::string worker, int64_t silent_ms) {
  JobEvent e = Make(Kind::kWorkerDead, now);
  e.worker = std::move(worker);
  e.silent_ms = silent_ms;
  return e;
}

JobEvent JobEvent::Joined(int64_t now, int64_t rank, SaveJoinRequest join) {
  JobEvent e = Make(Kind::kJoined, now);
  e.rank = rank;
  e.join = std::make_shared<const SaveJoinRequest>(std::move(join));
  return e;
}

JobEvent JobEvent::IoDone(int64_t now, Result<Json> result) {
  JobEvent e = Make(Kind::kIoDone, now);
  e.ok = result.ok();
  if (result.ok()) {
    e.result = std::move(*result);
  } else {
    e.error = result.status();
  }
  return e;
}

std::string_view IoKindName(IoKind kind) {
  switch (kind) {
    case IoKind::kCreateStaging: return "create_staging";
    case IoKind::kMerge: return "merge";
    case IoKind::kCommit: return "commit";
    case IoKind::kRetention: return "retention";
    case IoKind::kFindCommitted: return "find_committed";
    case IoKind::kVerify: return "verify";
    case IoKind::kReadSafetensors: return "read_safetensors";
    case IoKind::kWriteExportIndex: return "write_export_index";
  }
  return "?";
}

JobActions JobMachine::Step(const JobEvent& e) {
  if (ended_) return {};
  switch (e.kind) {
    case JobEvent::Kind::kStart:
      return Apply(OnStart(e.now_ms));
    case JobEvent::Kind::kTaskEnded:
      return Apply(OnTaskEnded(e));
    case JobEvent::Kind::kWorkerDead: {
      if (waiting_ != Waiting::kTasks) {
        Status st = OnWorkerDead(e.worker, e.silent_ms);
        return st.ok() ? JobActions{} : Fail(st);
      }
      for (const auto& [rank, t] : tasks_) {
        if (t.done || t.worker != e.worker) continue;
        return Fail(Unavailable("worker " + t.worker + " (rank " + std::to_string(rank) +
                                    ") is dead: no heartbeat for " + std::to_string(e.silent_ms) +
                                    " ms",
                                {{"worker", t.worker}, {"rank", rank}}));
      }
      return {};
    }
    case JobEvent::Kind::kJoined:
      if (!e.join) return {};
      return Apply(OnJoined(e.now_ms, e.rank, *e.join));
    case JobEvent::Kind::kIoDone:
      if (waiting_ != Waiting::kIo) return {};
      waiting_ = Waiting::kNothing;
      if (!e.ok) return Fail(e.error);
      if (cancel_requested_ && cancellable_) return Fail(CancelledStatus(spec_.id));
      return Apply(OnIoDone(e.now_ms, e.result));
    case JobEvent::Kind::kCancel:
      if (!cancellable_) return {};  // past the point of no return (a save's commit)
      cancel_requested_ = true;
      // A running I/O step cannot be interrupted: the job ends when it is done.
      if (waiting_ == Waiting::kIo) return {};
      return Fail(CancelledStatus(spec_.id));
    case JobEvent::Kind::kTick:
      if (deadline_ms_ > 0 && e.now_ms > deadline_ms_) return Fail(OnDeadline());
      return {};
    case JobEvent::Kind::kStop:
      return Fail(Unavailable("tesserad is shutting down"));
  }
  return {};
}

Result<JobActions> JobMachine::OnTaskEnded(const JobEvent& e) {
  if (waiting_ != Waiting::kTasks || e.round != round_) return JobActions{};  // a late report
  auto it = tasks_.find(e.rank);
  if (it == tasks_.end() || it->second.done) return JobActions{};
  if (!e.ok) {
    const std::string& w = it->second.worker;
    return e.error.WithContext("worker " + w + " (rank " + std::to_string(e.rank) + ")")
        .WithDetail("worker", w)
        .WithDetail("rank", e.rank);
  }
  it->second.done = true;
  it->second.result = e.result;
  for (const auto& [rank, t] : tasks_) {
    if (!t.done) return JobActions{};
  }
  std::map<int64_t, Json> results;
  for (auto& [rank, t] : tasks_) results[rank] = std::move(t.result);
  waiting_ = Waiting::kNothing;
  deadline_ms_ = 0;
  tasks_.clear();
  return OnTasksDone(e.now_ms, std::move(results));
}

Status JobMachine::OnDeadline() {
  std::vector<int64_t> pending;
  for (const auto& [rank, t] : tasks_) {
    if (!t.done) pending.push_back(rank);
  }
  return DeadlineExceeded("job " + spec_.id + " timed out in phase " + phase_ +
                              " waiting for ranks " + Json(pending).dump(),
                          {{"missing_ranks", pending}});
}

Result<JobActions> JobMachine::OnTasksDone(int64_t, std::map<int64_t, Json>) {
  return Internal("job " + spec_.id + " queued tasks it has no use for");
}

Result<JobActions> JobMachine::OnIoDone(int64_t, Json) {
  return Internal("job " + spec_.id + " ran an I/O step it has no use for");
}

Result<JobActions> JobMachine::OnJoined(int64_t, int64_t, const SaveJoinRequest&) {
  return JobActions{};  // only a save takes joins
}

Status JobMachine::OnWorkerDead(const std::string&, int64_t) { return Status::Ok(); }

JobActions JobMachine::OnFailure(const Status&) { return {}; }

JobAction JobMachine::SetPhase(const std::string& phase) {
  phase_ = phase;
  JobAction a;
  a.kind = JobAction::Kind::kSetPhase;
  a.phase = phase;
  return a;
}

JobAction JobMachine::QueueTasks(std::map<int64_t, Task> tasks, uint64_t total_bytes, int64_t now,
                                 int64_t timeout_ms) {
  ++round_;
  tasks_.clear();
  for (const auto& [rank, t] : tasks) {
    tasks_[rank].worker = spec_.mesh.workers.at(rank);
  }
  waiting_ = Waiting::kTasks;
  deadline_ms_ = now + timeout_ms;
  JobAction a;
  a.kind = JobAction::Kind::kQueueTasks;
  a.round = round_;
  a.tasks = std::move(tasks);
  a.total_bytes = total_bytes;
  return a;
}

JobAction JobMachine::SendTasks(std::map<int64_t, Task> tasks) {
  JobAction a;
  a.kind = JobAction::Kind::kSendTasks;
  a.tasks = std::move(tasks);
  return a;
}

JobAction JobMachine::RunIo(IoKind io) {
  waiting_ = Waiting::kIo;
  deadline_ms_ = 0;
  JobAction a;
  a.kind = JobAction::Kind::kRunIo;
  a.io = io;
  return a;
}

JobAction JobMachine::SetCheckpointState(CheckpointState state) {
  JobAction a;
  a.kind = JobAction::Kind::kSetCheckpointState;
  a.checkpoint_state = state;
  return a;
}

JobAction JobMachine::Cleanup(JobAction::Kind kind, const Status& st) {
  JobAction a;
  a.kind = kind;
  a.status = st;
  return a;
}

JobAction JobMachine::Finish(Json result) {
  JobAction a;
  a.kind = JobAction::Kind::kFinish;
  a.result = std::move(result);
  return a;
}

JobActions JobMachine::Fail(const Status& st, Json result) {
  JobActions out = OnFailure(st);
  JobAction finish = Finish(std::move(result));
  finish.status = st;
  out.push_back(std::move(finish));
  ended_ = true;
  waiting_ = Waiting::kNothing;
  deadline_ms_ = 0;
  return out;
}

JobActions JobMachine::Apply(Result<JobActions> next) {
  if (!next.ok()) return Fail(next.status());
  for (const JobAction& a : *next) {
    if (a.kind == JobAction::Kind::kFinish) {
      ended_ = true;
      deadline_ms_ = 0;
    }
  }
  return std::move(*next);
}

JobActions JobMachine::WriteRound(std::map<int64_t, Task> tasks, uint64_t total_bytes, int64_t now) {
  return JobActions{SetCheckpointState(CheckpointState::kWriting), SetPhase("write"),
                    QueueTasks(std::move(tasks), total_bytes, now, spec_.task_timeout_ms)};
}

Result<JobActions> JobMachine::MergeWritten(const std::map<int64_t, Json>& results, const std::string& what) {
  // The writes are done; every report is the barrier.
  JobAction merge = RunIo(IoKind::kMerge);
  for (const auto& [rank, res] : results) {
    auto w = WriteResultFromJson(res);
    if (!w.ok()) return w.status().WithContext("the " + what + " of worker " + spec_.mesh.workers.at(rank));
    if (w->fragment) merge.fragments.push_back(*w->fragment);
  }
  return JobActions{SetPhase("merge"), SetCheckpointState(CheckpointState::kMerging), std::move(merge)};
}

JobActions JobMachine::CommitStep(std::vector<storage::PlannedSlice> plan) {
  NoMoreCancel();
  JobAction commit = RunIo(IoKind::kCommit);
  commit.plan = std::move(plan);
  return JobActions{SetPhase("commit"), std::move(commit)};
}

}  // namespace tessera::service
