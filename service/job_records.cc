// The job records the loops keep (job_loop.cc): a job's creation, its end (what it
// held released), and the abort its workers are told of.
#include <cstdio>

#include "service/service.h"

namespace tessera::service {

Status Service::CreateJob(const JobSpec& spec, const std::string& kind, const std::string& mesh,
                          const Json& request, std::optional<SaveRequest> join) {
  const JobRecord job = jobs_.Create(spec.id, kind, mesh, spec.step, request, std::move(join));
  if (Status st = PersistJob(job); !st.ok()) {
    jobs_.Forget(spec.id);
    ReleaseHolds(spec);
    return st.WithContext("the " + kind + " job was not started");
  }
  jobs_.Announce(spec.id);
  return Status::Ok();
}

void Service::ReleaseHolds(const JobSpec& spec) {
  if (spec.holds_mesh) meshes_.Release(spec.mesh.mesh.name, spec.id);
  if (!spec.held_checkpoint.empty()) checkpoints_.Release(spec.held_checkpoint, spec.id);
  // A save's bases (job_loop.cc), however it ended.
  checkpoints_.ReleaseBases(spec.mesh.mesh.name, spec.step, spec.id);
}

void Service::FinishJob(const JobSpec& spec, const Status& status, Json result) {
  // Released before anyone can see the job ended: a delete that follows it finds the
  // checkpoints free.
  ReleaseHolds(spec);
  JobRegistry::Ended ended = jobs_.Finish(spec.id, status, std::move(result));
  const JobRecord& job = ended.record;
  (void)PersistJob(job);
  if (job.kind == "restore" && status.ok()) {
    metrics_.ObserveRestore((job.ended_ms - job.started_ms) / 1000.0,
                            job.result.value("bytes", uint64_t{0}));
  }
  // Every save's workers hear its end: a trainer waits for it, and a worker's next save
  // builds on this one once it committed (worker/save_bases.h).
  // A committed one's were told at its commit (job_loop.cc).
  const auto c = checkpoints_.Get(CheckpointRecord::Key(spec.mesh.mesh.name, spec.step));
  const bool told = c && c->job == spec.id && c->state == CheckpointState::kCommitted;
  if ((ended.joined || job.kind == "save") && !told) TellSaveEnded(spec, status);
  std::fprintf(stderr, "job %s (%s %s step %lld) %s%s\n", job.id.c_str(), job.kind.c_str(),
               job.mesh.c_str(), static_cast<long long>(job.step), StateString(job.state).c_str(),
               status.ok() ? "" : (": " + status.message()).c_str());
}

void Service::AbortOnWorkers(const MeshRecord& mesh, const std::string& job_id, bool collective,
                             const Status& error) {
  Task abort;
  abort.job = job_id;
  abort.kind = TaskKind::kAbort;
  if (collective) {
    abort.mesh_name = mesh.mesh.name;
    abort.error = error;
  }
  workers_.QueueToLive(mesh.workers, [&] {
    abort.id = NewId("t");
    return TaskToJson(abort);
  });
}

}  // namespace tessera::service
