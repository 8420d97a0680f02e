// A worker's join of a save (PUT /api/v1/meshes/{mesh}/checkpoints/{step}), which is
// also its report: it brings its snapshot's description and what it wrote at that
// snapshot (or why it could not). The first worker of an in-loop save creates the save;
// a REST save's workers join the job that asked them to snapshot. The save's end is
// pushed to the workers as a save_ended task on their long-poll: no write task, no
// report, no polling for the commit.
#include <algorithm>

#include "service/service.h"

namespace tessera::service {

Result<std::pair<int, Json>> Service::JoinSave(const std::string& mesh,
                                               const SaveJoinRequest& join) {
  const int64_t step = join.save.step;
  const std::string key = CheckpointRecord::Key(mesh, step);
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Get(mesh));
  auto at = std::find(m.workers.begin(), m.workers.end(), join.worker);
  if (at == m.workers.end()) {
    return InvalidArgument("worker " + join.worker + " is not a worker of mesh " + mesh,
                           {{"field", "worker"}, {"worker", join.worker}, {"mesh", mesh}});
  }
  const int64_t rank = at - m.workers.begin();
  const std::string what = "step " + std::to_string(step) + " of mesh " + mesh;
  // Two workers' first calls may race to create the save: one reserves the step, and
  // the other finds that save on its second look.
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto existing = checkpoints_.Get(key);
    if (join.job) {
      // A REST save's worker joins only its own job, while that job can still commit.
      const bool open = existing && existing->job == *join.job && jobs_.Running(*join.job) &&
                        existing->state != CheckpointState::kFailed;
      if (!open) {
        // A late writer: its job ended (and its staging went with it). It removes its
        // file; the dir it may have made again goes with the next collection.
        CollectGarbageSoon();
        return Conflict("the save of " + what + " by job " + *join.job +
                            " has ended; this join comes too late",
                        {{"mesh", mesh}, {"step", step}, {"job", *join.job}, {"reason", "job_ended"}});
      }
      jobs_.Post(*join.job, JobEvent::Joined(clock_->MonoMs(), rank, join));
      return std::make_pair(200, Json{{"job", *join.job}, {"checkpoint", existing->Summary()}});
    }
    if (existing && existing->state == CheckpointState::kFailed && join.snapshot_age_ms >= 0) {
      // A worker's join of the save that failed: its snapshot was taken before that
      // save ended (it was late, or its answer was lost). Not a new save of the step.
      // (A job still running with its checkpoint failed is ending now.)
      const int64_t ended = jobs_.EndedMs(existing->job);
      const bool ending = ended == 0 && jobs_.Running(existing->job);
      if (ending || (ended > 0 && clock_->WallMs() - join.snapshot_age_ms <= ended)) {
        const Json error = existing->error.is_object() ? existing->error : Json::object();
        CollectGarbageSoon();
        return Conflict("the save of " + what + " by job " + existing->job + " failed before this join: " +
                            error.value("message", std::string("see the job")),
                        {{"mesh", mesh}, {"step", step}, {"job", existing->job}, {"reason", "job_ended"}});
      }
    }
    if (!existing || existing->state == CheckpointState::kFailed) {
      const std::string job_id = NewJobId();
      ASSIGN_OR_RETURN(MeshRecord held, meshes_.Hold(mesh, job_id));
      auto c = CreateSaveJob(job_id, held, join.save, /*joined=*/true);
      if (!c.ok() && c.status().code() == Code::kConflict && attempt == 0) continue;
      RETURN_IF_ERROR(c.status());
      jobs_.Post(c->job, JobEvent::Joined(clock_->MonoMs(), rank, join));
      return std::make_pair(201, Json{{"job", c->job}, {"checkpoint", c->Summary()}});
    }
    const CheckpointRecord& c = *existing;
    const Json details = {{"mesh", mesh}, {"step", step}, {"state", c.state}, {"job", c.job}};
    if (c.state == CheckpointState::kCommitted) return Conflict(what + " is already committed", details);
    auto save = jobs_.JoinOf(c.job);
    if (!save) {
      return Conflict(what + " is being written by job " + c.job + ", which no worker joins",
                      details);
    }
    if (!save->request.wait_for_trainer) {
      return Conflict(what + " is being saved by job " + c.job +
                          ", which was started over REST without wait_for_trainer, not by the "
                          "training loop",
                      details);
    }
    // The trainers' saves join a REST save that waits for them whatever their own
    // compression; an in-loop save's workers must agree on the request.
    if (save->from_loop && !save->request.SameSave(join.save)) {
      return Conflict(what + " is being saved by job " + c.job + " with another request " +
                          save->request.ToJson().dump() + " than " + join.save.ToJson().dump(),
                      details);
    }
    // A repeated join (its answer was lost) changes nothing: the machine keeps the first.
    jobs_.Post(c.job, JobEvent::Joined(clock_->MonoMs(), rank, join));
    return std::make_pair(200, Json{{"job", c.job}, {"checkpoint", c.Summary()}});
  }
  return Internal("the save of " + key + " changed twice while joining it");
}

void Service::TellSaveEnded(const JobSpec& spec, const Status& st) {
  Task ended;
  ended.job = spec.id;
  ended.kind = TaskKind::kSaveEnded;
  ended.mesh_name = spec.mesh.mesh.name;
  ended.step = spec.step;
  ended.error = st;
  workers_.QueueToLive(spec.mesh.workers, [&] {
    ended.id = NewId("t");
    return TaskToJson(ended);
  });
}

}  // namespace tessera::service
