// Retention: a mesh's policy (keep_last, keep_every_n_steps), applied after each
// committed save and when the policy changes.
#include <algorithm>
#include <cstdio>

#include "service/service.h"

namespace tessera::service {

Result<Json> Service::PutRetention(const std::string& mesh, const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(auto keep_last, OptionalInt(body, "keep_last"));
  ASSIGN_OR_RETURN(auto every, OptionalInt(body, "keep_every_n_steps"));
  if ((keep_last && *keep_last < 0) || (every && *every < 0)) {
    return InvalidArgument("retention values must be ≥ 0",
                           {{"field", keep_last && *keep_last < 0 ? "keep_last" : "keep_every_n_steps"}});
  }
  RetentionPolicy p{keep_last.value_or(0), every.value_or(0)};
  {
    WriteTurns::Turn turn = mesh_writes_.Take();
    RETURN_IF_ERROR(meshes_.Get(mesh).status());
    const MeshState before = MeshStateOf(mesh);
    MeshState after = before;
    after.retention = p;
    // Every write of the mesh takes this turn, so it is still there to take the policy.
    RETURN_IF_ERROR(WriteState(MeshWrite("set the retention policy of mesh " + mesh, mesh, before,
                                         after, [&] { (void)meshes_.SetRetention(mesh, p); })));
  }
  RETURN_IF_ERROR(ApplyRetention(mesh));
  Json out = p.ToJson();
  out["mesh"] = mesh;
  return out;
}

Status Service::ApplyRetention(const std::string& mesh) {
  // The steps to prune are chosen in the turn that deletes them: a delete or a commit
  // that came first is seen, and none comes between the choice and the deletes.
  MeshRoots::Turn turn = mesh_roots_.Take(mesh);
  auto p = meshes_.Retention(mesh);
  if (!p) return Status::Ok();
  const std::vector<int64_t> committed = checkpoints_.CommittedSteps(mesh);
  const std::vector<int64_t> doomed = StepsToPrune(committed, *p);
  if (doomed.empty()) return Status::Ok();
  auto m = meshes_.Get(mesh);
  const std::optional<int64_t> floor =
      m.ok() ? base_use_.Floor(m->workers, mesh,
                               [&](int64_t s) { return SaveMayCommit(mesh, s, committed.back()); })
             : std::nullopt;
  for (int64_t step : doomed) {
    if (floor && step >= *floor) continue;  // a save may still build on it: a later retention's
    Status st = DeleteInTurn(turn, step);
    if (!st.ok() && st.code() != Code::kNotFound) return st;
  }
  return Status::Ok();
}

void Service::AwaitBasesHeard(const JobSpec& spec) {
  const std::string& mesh = spec.mesh.mesh.name;
  auto p = meshes_.Retention(mesh);
  if (!p || StepsToPrune(checkpoints_.CommittedSteps(mesh), *p).empty()) return;
  std::vector<std::string> live;
  for (const std::string& w : spec.mesh.workers) {
    auto record = workers_.Get(w);
    if (record && record->state != WorkerState::kDead) live.push_back(w);
  }
  if (!base_use_.WaitHeard(live, mesh, spec.step, options_.lease_ms)) {
    std::fprintf(stderr, "job %s: not every worker of mesh %s said within a lease what it builds "
                 "on; retention keeps what their last word says they may\n", spec.id.c_str(),
                 mesh.c_str());
  }
}

bool Service::SaveMayCommit(const std::string& mesh, int64_t step, int64_t newest) const {
  if (auto c = checkpoints_.Get(CheckpointRecord::Key(mesh, step))) {
    return c->state != CheckpointState::kCommitted && c->state != CheckpointState::kFailed;
  }
  return step > newest;
}

}  // namespace tessera::service
