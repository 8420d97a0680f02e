// The thin loop around a job's state machine (job_machine.h): it feeds the machine
// its events (its inbox, the results of the I/O it ran, ticks at its deadline) and
// carries out the actions Step returns: tasks delivered to the workers, I/O run
// outside every lock, records persisted and events published.
#include <deque>

#include "service/job_inbox.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/save_transaction.h"
#include "storage/thread_pool.h"
#include "storage/verify.h"

namespace tessera::service {

void Service::Launch(std::unique_ptr<JobMachine> machine) {
  auto shared = std::shared_ptr<JobMachine>(std::move(machine));
  job_threads_.Spawn([this, shared] { (void)DriveJob(*shared); });
}

void Service::PostToJob(const std::string& job_id, JobEvent e) {
  auto it = inboxes_.find(job_id);
  if (it != inboxes_.end()) it->second->Post(std::move(e));
}

Status Service::DriveJob(JobMachine& m) {
  const std::string& id = m.spec().id;
  std::shared_ptr<JobInbox> inbox;
  {
    MutexLock lock(mu_);
    BeginJob(id);
    inbox = inboxes_.at(id);
  }
  // Events the loop itself produces (an I/O step's result), before the inbox's.
  std::deque<JobEvent> local;
  Status outcome = Status::Ok();
  JobActions actions = m.Step(JobEvent::Start(MonoMs()));
  while (true) {
    for (JobAction& a : actions) {
      if (a.kind == JobAction::Kind::kFinish) outcome = a.status;
      ExecuteJobAction(m, a, &local);
    }
    if (m.ended()) return outcome;
    JobEvent e;
    if (!local.empty()) {
      e = std::move(local.front());
      local.pop_front();
    } else {
      e = inbox->Next(m.deadline_ms());
    }
    actions = m.Step(e);
  }
}

void Service::ExecuteJobAction(JobMachine& m, JobAction& a, std::deque<JobEvent>* local) {
  const JobSpec& spec = m.spec();
  switch (a.kind) {
    case JobAction::Kind::kSetPhase: {
      MutexLock lock(mu_);
      SetPhase(spec.id, a.phase);
      return;
    }
    case JobAction::Kind::kSetCheckpointState: {
      MutexLock lock(mu_);
      SetCheckpointState(CheckpointRecord::Key(spec.mesh.mesh.name, spec.step), a.checkpoint_state);
      return;
    }
    case JobAction::Kind::kQueueTasks: {
      MutexLock lock(mu_);
      if (auto dead = QueueRound(spec, a)) local->push_back(std::move(*dead));
      return;
    }
    case JobAction::Kind::kRunIo:
      local->push_back(JobEvent::IoDone(MonoMs(), RunJobIo(spec, a)));
      return;
    case JobAction::Kind::kAbandonSave:
      AbandonSave(spec, a.status);
      return;
    case JobAction::Kind::kAbortCollective: {
      MutexLock lock(mu_);
      AbortOnWorkers(spec.mesh, spec.id, /*collective=*/true, a.status);
      return;
    }
    case JobAction::Kind::kFinish: {
      MutexLock lock(mu_);
      JobRecord& job = jobs_.at(spec.id);
      if (job.kind == "restore" && a.status.ok()) {
        metrics_.ObserveRestore((WallMs() - job.started_ms) / 1000.0,
                                a.result.value("bytes", uint64_t{0}));
      }
      FinishJob(spec.id, a.status, std::move(a.result));
      inboxes_.erase(spec.id);
      if (save_joins_.erase(spec.id)) TellSaveEnded(spec, a.status);
      return;
    }
  }
}

std::optional<JobEvent> Service::QueueRound(const JobSpec& spec, const JobAction& a) {
  JobRecord& job = jobs_.at(spec.id);
  for (const auto& [tid, t] : job.tasks) RetireTask(tid);
  job.tasks.clear();
  job.done_bytes = 0;
  job.total_bytes = a.total_bytes;
  // Every worker must be there before any task goes out.
  for (const auto& [rank, task] : a.tasks) {
    const std::string& wid = spec.mesh.workers.at(rank);
    auto w = workers_.find(wid);
    if (w == workers_.end() || w->second.state == WorkerState::kDead) {
      const int64_t silent = w == workers_.end() ? 0 : MonoMs() - w->second.last_heartbeat_mono_ms();
      return JobEvent::WorkerDead(MonoMs(), wid, silent);
    }
  }
  for (const auto& [rank, task] : a.tasks) {
    const std::string& wid = spec.mesh.workers.at(rank);
    Task t = task;
    t.id = NewId("t");
    t.job = spec.id;
    TaskState ts;
    ts.worker = wid;
    ts.rank = rank;
    ts.round = a.round;
    job.tasks[t.id] = ts;
    task_jobs_[t.id] = spec.id;
    QueueTask(&workers_.at(wid), t);
  }
  PublishJob(job);
  return std::nullopt;
}

storage::SaveTransaction Service::SaveTransactionOf(const JobSpec& spec) const {
  return storage::SaveTransaction(env_, options_.checkpoint_root, spec.mesh.mesh, spec.step,
                                  spec.id);
}

Result<Json> Service::RunJobIo(const JobSpec& spec, const JobAction& a) {
  const std::string& mesh = spec.mesh.mesh.name;
  const std::string& root = options_.checkpoint_root;
  switch (a.io) {
    case IoKind::kCreateStaging:
      RETURN_IF_ERROR(SaveTransactionOf(spec).Stage());
      return Json::object();
    case IoKind::kMerge: {
      Json metadata;
      {
        MutexLock lock(mu_);
        metadata = checkpoints_.at(CheckpointRecord::Key(mesh, spec.step)).metadata;
      }
      RETURN_IF_ERROR(SaveTransactionOf(spec).Merge(a.fragments, metadata));
      return Json::object();
    }
    case IoKind::kCommit: {
      ASSIGN_OR_RETURN(std::string dir, SaveTransactionOf(spec).Commit());
      ASSIGN_OR_RETURN(auto index, storage::CheckpointIndex::Open(env_, dir));
      MutexLock lock(mu_);
      return RecordCommitted(spec, index, a.plan);
    }
    case IoKind::kRetention: {
      Status retained = ApplyRetention(mesh);
      if (retained.ok()) return Json::object();
      return Json{{"retention_error", ErrorBody(retained)["error"]}};
    }
    case IoKind::kFindCommitted: {
      const std::string& of = spec.checkpoint_mesh.empty() ? mesh : spec.checkpoint_mesh;
      ASSIGN_OR_RETURN(std::string dir, storage::CommittedDir(env_, root, of, spec.step));
      return Json{{"dir", dir}};
    }
    case IoKind::kVerify:
      return VerifyIo(spec);
  }
  return Internal("unknown I/O step");
}

Json Service::VerifyIo(const JobSpec& spec) {
  storage::ThreadPool pool(2);
  auto last = std::chrono::steady_clock::now();
  auto dir = storage::CommittedDir(env_, options_.checkpoint_root, spec.mesh.mesh.name, spec.step);
  auto report = !dir.ok() ? Result<storage::VerifyReport>(dir.status())
                          : storage::VerifyCheckpoint(env_, *dir, &pool, [&](uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(100) && done != total) return;
    last = now;
    MutexLock l(mu_);
    JobRecord& j = jobs_.at(spec.id);
    j.done_bytes = done;
    j.total_bytes = total;
    PublishJob(j);
  });
  if (!report.ok()) return Json{{"report", nullptr}, {"error", ErrorBody(report.status())["error"]}};
  Json out = {{"report", report->ToJson()}, {"error", nullptr}};
  if (!report->ok()) {
    std::string first = report->problems.empty()
                            ? "tensor '" + report->bad_chunks[0].tensor + "' in " +
                                  report->bad_chunks[0].file + " at offset " +
                                  std::to_string(report->bad_chunks[0].offset)
                            : report->problems[0];
    out["error"] = ErrorBody(DataLoss(
        "checkpoint is corrupt: " + std::to_string(report->bad_chunks.size()) + " bad chunks, " +
            std::to_string(report->problems.size()) + " problems; first: " + first,
        {{"bad_chunks", out["report"]["bad_chunks"]}, {"problems", out["report"]["problems"]}}))["error"];
  }
  return out;
}

}  // namespace tessera::service
