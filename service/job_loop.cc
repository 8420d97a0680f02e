// The thin loop around a job's state machine (job_machine.h): it feeds the machine
// its events (its inbox, the results of the I/O it ran, ticks at its deadline) and
// carries out the actions Step returns: tasks delivered to the workers, I/O run
// outside every lock, records persisted and events published.
#include <deque>

#include "service/job_inbox.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/root_meta.h"
#include "storage/save_transaction.h"
#include "storage/thread_pool.h"
#include "storage/verify.h"

namespace tessera::service {

void Service::Launch(std::unique_ptr<JobMachine> machine) {
  auto shared = std::shared_ptr<JobMachine>(std::move(machine));
  job_threads_.Spawn([this, shared] { (void)DriveJob(*shared); });
}

Status Service::DriveJob(JobMachine& m) {
  auto [record, inbox] = jobs_.Begin(m.spec().id);
  (void)PersistJob(record);
  // Events the loop itself produces (an I/O step's result), before the inbox's.
  std::deque<JobEvent> local;
  Status outcome = Status::Ok();
  JobActions actions = m.Step(JobEvent::Start(clock_->MonoMs()));
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
    case JobAction::Kind::kSetPhase:
      (void)PersistJob(jobs_.SetPhase(spec.id, a.phase));
      return;
    case JobAction::Kind::kSetCheckpointState:
      SetCheckpointState(CheckpointRecord::Key(spec.mesh.mesh.name, spec.step), a.checkpoint_state);
      return;
    case JobAction::Kind::kQueueTasks:
      if (auto dead = QueueRound(spec, a)) local->push_back(std::move(*dead));
      return;
    case JobAction::Kind::kSendTasks:
      if (auto dead = SendTasks(spec, a)) local->push_back(std::move(*dead));
      return;
    case JobAction::Kind::kSetProgress:
      jobs_.Progress(spec.id, a.done_bytes, a.total_bytes);
      return;
    case JobAction::Kind::kRunIo:
      local->push_back(JobEvent::IoDone(clock_->MonoMs(), RunJobIo(spec, a)));
      return;
    case JobAction::Kind::kAbandonSave:
      AbandonSave(spec, a.status);
      return;
    case JobAction::Kind::kAbortCollective:
      AbortOnWorkers(spec.mesh, spec.id, /*collective=*/true, a.status);
      return;
    case JobAction::Kind::kFinish:
      FinishJob(spec, a.status, std::move(a.result));
      return;
  }
}

std::optional<JobEvent> Service::QueueRound(const JobSpec& spec, const JobAction& a) {
  auto tasks = jobs_.NewRound(spec.id, spec.mesh.workers, a);
  // Every worker must be there before any task goes out.
  const int64_t now = clock_->MonoMs();
  if (auto missing = workers_.QueueAll(tasks, now)) {
    return JobEvent::WorkerDead(now, missing->worker, missing->silent_ms);
  }
  return std::nullopt;
}

std::optional<JobEvent> Service::SendTasks(const JobSpec& spec, const JobAction& a) {
  std::vector<std::pair<std::string, Json>> tasks;
  for (const auto& [rank, task] : a.tasks) {
    Task t = task;
    t.id = NewId("t");
    t.job = spec.id;
    tasks.emplace_back(spec.mesh.workers.at(rank), TaskToJson(t));
  }
  const int64_t now = clock_->MonoMs();
  if (auto missing = workers_.QueueAll(tasks, now)) {
    return JobEvent::WorkerDead(now, missing->worker, missing->silent_ms);
  }
  return std::nullopt;
}

storage::SaveTransaction Service::SaveTransactionOf(const JobSpec& spec) const {
  return storage::SaveTransaction(env_, options_.checkpoint_root, spec.mesh.mesh, spec.step,
                                  spec.staging_id.empty() ? spec.id : spec.staging_id);
}

Result<Json> Service::RunJobIo(const JobSpec& spec, const JobAction& a) {
  const std::string& mesh = spec.mesh.mesh.name;
  const std::string& root = options_.checkpoint_root;
  switch (a.io) {
    case IoKind::kCreateStaging:
      RETURN_IF_ERROR(SaveTransactionOf(spec).Stage());
      return Json::object();
    case IoKind::kMerge: {
      auto c = checkpoints_.Get(CheckpointRecord::Key(mesh, spec.step));
      if (!c) return Internal("the record of checkpoint " + mesh + " step " + std::to_string(spec.step) + " is gone");
      if (!a.slices.empty()) {
        RETURN_IF_ERROR(SaveTransactionOf(spec).MergeSlices(a.slices, c->metadata));
      } else {
        RETURN_IF_ERROR(SaveTransactionOf(spec).Merge(a.fragments, c->metadata));
      }
      return Json::object();
    }
    case IoKind::kCommit: {
      RETURN_IF_ERROR(Fence("commit step " + std::to_string(spec.step) + " of mesh " + mesh));
      ASSIGN_OR_RETURN(std::string dir, SaveTransactionOf(spec).Commit());
      ASSIGN_OR_RETURN(Json summary, storage::ReadSummary(env_, dir));
      return RecordCommitted(spec, summary, a.plan);
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
    case IoKind::kReadSafetensors:
      return ReadSafetensorsIo(a.io_input);
    case IoKind::kWriteExportIndex:
      return WriteExportIndexIo(a.io_input);
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
    jobs_.Progress(spec.id, done, total);
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
