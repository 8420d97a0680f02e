// Retention: a mesh's policy (keep_last, keep_every_n_steps), applied after each
// committed save and when the policy changes.
#include <algorithm>

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
  const std::vector<int64_t> doomed = StepsToPrune(checkpoints_.CommittedSteps(mesh), *p);
  for (int64_t step : doomed) {
    Status st = DeleteInTurn(turn, step);
    if (!st.ok() && st.code() != Code::kNotFound) return st;
  }
  return Status::Ok();
}

}  // namespace tessera::service
