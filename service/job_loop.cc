// tesserad's side of a job's runtime (job_runtime.h): the effects of the machines'
// actions. Tasks go to the workers' queues, I/O runs outside every lock, records are
// persisted and events published.
#include "service/job_inbox.h"
#include "service/job_runtime.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/root_meta.h"
#include "storage/save_transaction.h"
#include "storage/thread_pool.h"
#include "storage/verify.h"

namespace tessera::service {

// The Service's effects, for the runtime of each of its jobs.
class JobLoopEffects final : public JobEffects {
 public:
  explicit JobLoopEffects(Service* s) : s_(s) {}
  void SetPhase(const JobSpec& spec, const std::string& phase) override {
    (void)s_->PersistJob(s_->jobs_.SetPhase(spec.id, phase));
  }
  void SetCheckpointState(const JobSpec& spec, CheckpointState state) override {
    s_->SetCheckpointState(CheckpointRecord::Key(spec.mesh.mesh.name, spec.step), state);
  }
  void SetProgress(const JobSpec& spec, const JobAction& a) override {
    s_->jobs_.SaveProgress(spec.id, a.done_bytes, a.total_bytes, spec.mesh.workers, a.joined,
                           a.complete);
  }
  std::optional<JobEvent> QueueRound(const JobSpec& spec, const JobAction& a) override {
    return s_->QueueRound(spec, a);
  }
  std::optional<JobEvent> SendTasks(const JobSpec& spec, const JobAction& a) override {
    return s_->SendTasks(spec, a);
  }
  Result<Json> RunIo(const JobSpec& spec, const JobAction& a) override { return s_->RunJobIo(spec, a); }
  void AbandonSave(const JobSpec& spec, const Status& why) override { s_->AbandonSave(spec, why); }
  void AbortCollective(const JobSpec& spec, const Status& why) override {
    s_->AbortOnWorkers(spec.mesh, spec.id, /*collective=*/true, why);
  }
  void Finish(const JobSpec& spec, const Status& status, Json result) override {
    s_->FinishJob(spec, status, std::move(result));
  }
  int64_t NowMs() override { return s_->clock_->MonoMs(); }

 private:
  Service* const s_;
};

void Service::Launch(std::unique_ptr<JobMachine> machine) {
  auto shared = std::shared_ptr<JobMachine>(std::move(machine));
  job_threads_.Spawn([this, shared] { (void)DriveJob(*shared); });
}

Status Service::DriveJob(JobMachine& m) {
  auto [record, inbox] = jobs_.Begin(m.spec().id);
  (void)PersistJob(record);
  JobLoopEffects effects(this);
  return JobRuntime(&m, std::move(inbox), &effects).Run();
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
      if (a.io_input.is_object() && a.io_input.contains("metadata")) c->metadata = a.io_input["metadata"];
      if (!a.slices.empty()) {
        // The checkpoints its unchanged chunks refer to stay until it commits.
        for (int64_t base : a.bases) {
          Status held = checkpoints_.HoldBase(mesh, base, spec.id);
          if (!held.ok()) {
            return Conflict(
                "the unchanged chunks of this save refer to step " + std::to_string(base) +
                    " of mesh " + mesh + ", which is no longer committed (" + held.message() +
                    "); its workers write every chunk in the next save",
                {{"mesh", mesh}, {"step", base}});
          }
        }
        RETURN_IF_ERROR(SaveTransactionOf(spec).MergeSlices(a.slices, c->metadata, a.bases));
      } else {
        RETURN_IF_ERROR(SaveTransactionOf(spec).Merge(a.fragments, c->metadata));
      }
      return Json::object();
    }
    case IoKind::kCommit: {
      // In the mesh's root turn: no delete's sweep decides from a root read before this
      // commit, and no retention chooses between it and the release of its bases.
      MeshRoots::Turn turn = mesh_roots_.Take(mesh);
      RETURN_IF_ERROR(Fence("commit step " + std::to_string(spec.step) + " of mesh " + mesh));
      ASSIGN_OR_RETURN(std::string dir, SaveTransactionOf(spec).Commit());
      // Committed, it keeps what it refers to itself: its bases may go.
      if (!a.bases.empty()) checkpoints_.ReleaseBases(mesh, spec.step, spec.id);
      ASSIGN_OR_RETURN(Json summary, storage::ReadSummary(env_, dir));
      Json committed = RecordCommitted(spec, summary, a.plan);
      // Its workers hear of it now, before its retention: their next saves build on it.
      if (!spec.staging_id.empty()) TellSaveEnded(spec, Status::Ok());
      return committed;
    }
    case IoKind::kRetention: {
      // A save's workers were told of its commit (above): retention waits for their word
      // on what they build on since, so it takes no base of a save still in flight.
      if (!spec.staging_id.empty()) AwaitBasesHeard(spec);
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
