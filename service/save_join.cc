// The in-loop save in one hop: each worker's create-or-join
// (PUT /api/v1/meshes/{mesh}/checkpoints/{step}) brings its trainer's snapshot, the
// save job waits for every rank's, and its end is pushed to the workers as a
// save_ended task on their long-poll: no snapshot task, no id read out of a 409, no
// polling for the commit.
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
  if (existing == checkpoints_.end() || existing->second.state == "failed") {
    ASSIGN_OR_RETURN(const CheckpointRecord* c, CreateSaveJob(*m, join.save, /*joined=*/true));
    save_joins_.at(c->job).snapshots[rank] = join.snapshot;
    return std::make_pair(201, Json{{"job", c->job}, {"checkpoint", c->Summary()}});
  }
  const CheckpointRecord& c = existing->second;
  const Json details = {{"mesh", mesh}, {"step", step}, {"state", c.state}, {"job", c.job}};
  const std::string what = "step " + std::to_string(step) + " of mesh " + mesh;
  if (c.state == "committed") return Conflict(what + " is already committed", details);
  auto joins = save_joins_.find(c.job);
  if (joins == save_joins_.end()) {
    return Conflict(what + " is being saved by job " + c.job +
                        ", which was started over REST, not by the training loop",
                    details);
  }
  if (!joins->second.request.SameSave(join.save)) {
    return Conflict(what + " is being saved by job " + c.job + " with another request " +
                        joins->second.request.ToJson().dump() + " than " +
                        join.save.ToJson().dump(),
                    details);
  }
  // A repeated join (its answer was lost) changes nothing once the job has moved on.
  joins->second.snapshots.emplace(rank, join.snapshot);
  cv_.NotifyAll();
  return std::make_pair(200, Json{{"job", c.job}, {"checkpoint", c.Summary()}});
}

Result<std::map<int64_t, SnapshotResult>> Service::AwaitJoins(const SaveRun& run) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.join_wait_ms);
  const int64_t ranks = run.mesh.mesh.num_workers();
  while (true) {
    if (stopping_) return Unavailable("tesserad is shutting down");
    if (jobs_.at(run.job_id).cancel_requested) return CancelledStatus(run.job_id);
    const auto& joined = save_joins_.at(run.job_id).snapshots;
    if (static_cast<int64_t>(joined.size()) == ranks) return joined;
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < ranks; ++r) {
      if (joined.count(r)) continue;
      const std::string& wid = run.mesh.workers[r];
      auto w = workers_.find(wid);
      if (w == workers_.end() || w->second.state == "dead") {
        return Unavailable("worker " + wid + " (rank " + std::to_string(r) +
                               ") is dead; it had not joined the save of step " +
                               std::to_string(run.step),
                           {{"worker", wid}, {"rank", r}});
      }
      missing.push_back(r);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      Json workers = Json::array();
      for (int64_t r : missing) workers.push_back(run.mesh.workers[r]);
      return DeadlineExceeded(
          "the trainers of ranks " + Json(missing).dump() + " (workers " + workers.dump() +
              ") did not call save(" + std::to_string(run.step) + ") within " +
              std::to_string(options_.join_wait_ms) + " ms of the first",
          {{"missing_ranks", missing}, {"workers", workers}});
    }
    cv_.WaitFor(mu_, std::chrono::milliseconds(200));
  }
}

void Service::TellSaveEnded(const SaveRun& run, const Status& st) {
  Task ended;
  ended.job = run.job_id;
  ended.kind = TaskKind::kSaveEnded;
  ended.mesh_name = run.mesh.mesh.name;
  ended.step = run.step;
  ended.error = st;
  for (const std::string& wid : run.mesh.workers) {
    auto w = workers_.find(wid);
    if (w == workers_.end() || w->second.state == "dead") continue;
    ended.id = NewId("t");
    QueueTask(&w->second, ended);
  }
}

}  // namespace tessera::service
