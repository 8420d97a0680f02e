// The in-loop save in one hop: each worker's create-or-join
// (PUT /api/v1/meshes/{mesh}/checkpoints/{step}) brings its trainer's snapshot to the
// save's machine (SaveMachine waits for every rank's), and its end is pushed to the
// workers as a save_ended task on their long-poll: no snapshot task, no id read out of
// a 409, no polling for the commit.
#include <algorithm>

#include "service/service.h"

namespace tessera::service {

Result<std::pair<int, Json>> Service::JoinSave(const std::string& mesh,
                                               const SaveJoinRequest& join) {
  const int64_t step = join.save.step;
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(const MeshRecord* m, ReadyMesh(mesh));
  auto at = std::find(m->workers.begin(), m->workers.end(), join.worker);
  if (at == m->workers.end()) {
    return InvalidArgument("worker " + join.worker + " is not a worker of mesh " + mesh,
                           {{"field", "worker"}, {"worker", join.worker}, {"mesh", mesh}});
  }
  const int64_t rank = at - m->workers.begin();
  auto existing = checkpoints_.find(CheckpointRecord::Key(mesh, step));
  if (existing == checkpoints_.end() || existing->second.state == CheckpointState::kFailed) {
    ASSIGN_OR_RETURN(const CheckpointRecord* c, CreateSaveJob(*m, join.save, /*joined=*/true));
    PostToJob(c->job, JobEvent::Joined(MonoMs(), rank, join.snapshot));
    return std::make_pair(201, Json{{"job", c->job}, {"checkpoint", c->Summary()}});
  }
  const CheckpointRecord& c = existing->second;
  const Json details = {{"mesh", mesh}, {"step", step}, {"state", c.state}, {"job", c.job}};
  const std::string what = "step " + std::to_string(step) + " of mesh " + mesh;
  if (c.state == CheckpointState::kCommitted) return Conflict(what + " is already committed", details);
  auto joins = save_joins_.find(c.job);
  if (joins == save_joins_.end()) {
    return Conflict(what + " is being saved by job " + c.job +
                        ", which was started over REST, not by the training loop",
                    details);
  }
  if (!joins->second.SameSave(join.save)) {
    return Conflict(what + " is being saved by job " + c.job + " with another request " +
                        joins->second.ToJson().dump() + " than " + join.save.ToJson().dump(),
                    details);
  }
  // A repeated join (its answer was lost) changes nothing: the machine keeps the first.
  PostToJob(c.job, JobEvent::Joined(MonoMs(), rank, join.snapshot));
  return std::make_pair(200, Json{{"job", c.job}, {"checkpoint", c.Summary()}});
}

void Service::TellSaveEnded(const JobSpec& spec, const Status& st) {
  Task ended;
  ended.job = spec.id;
  ended.kind = TaskKind::kSaveEnded;
  ended.mesh_name = spec.mesh.mesh.name;
  ended.step = spec.step;
  ended.error = st;
  for (const std::string& wid : spec.mesh.workers) {
    auto w = workers_.find(wid);
    if (w == workers_.end() || w->second.state == WorkerState::kDead) continue;
    ended.id = NewId("t");
    QueueTask(&w->second, ended);
  }
}

}  // namespace tessera::service
