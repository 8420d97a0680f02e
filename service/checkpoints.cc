// The checkpoints of a mesh in the catalog: list, detail and delete (the records live
// in the CheckpointRegistry, checkpoint_registry.h).
#include "api/names.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"

namespace tessera::service {

Result<Json> Service::ListCheckpoints(const std::string& mesh) {
  std::vector<Json> list = checkpoints_.Summaries(mesh);
  if (list.empty() && !meshes_.Has(mesh)) return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  return Json(std::move(list));
}

Result<Json> Service::GetCheckpoint(const std::string& mesh, const std::string& step) {
  if (step == "latest") {
    ASSIGN_OR_RETURN(CheckpointRecord c, checkpoints_.FindCommitted(mesh, step));
    return c.ToJson();
  }
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  auto c = checkpoints_.Get(CheckpointRecord::Key(mesh, s));
  if (!c) {
    return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(s),
                    {{"mesh", mesh}, {"step", s}});
  }
  return c->ToJson();
}

Status Service::DeleteCheckpoint(const std::string& mesh, const std::string& step_text) {
  ASSIGN_OR_RETURN(int64_t step, ParseStep(step_text));
  const std::string key = CheckpointRecord::Key(mesh, step);
  // From here no job can hold it, and no save can take its step, until EndDelete.
  RETURN_IF_ERROR(checkpoints_.BeginDelete(mesh, step).status());
  StateWrite w;
  w.what = "delete step " + std::to_string(step) + " of mesh " + mesh;  // fenced by WriteState
  w.root = [&]() -> Status {
    Status st = storage::DeleteCheckpoint(env_, options_.checkpoint_root, mesh, step);
    return st.code() == Code::kNotFound ? Status::Ok() : st;  // gone already: deleted
  };
  // No undo: deleted files do not come back, so memory follows the root.
  w.catalog = {{"checkpoints", key, std::nullopt}};
  bool deleted = false;
  w.memory = [&] { deleted = true; };
  Status st = WriteState(w);
  checkpoints_.EndDelete(key, deleted);
  RETURN_IF_ERROR(st);
  events_.Publish("checkpoint", {{"mesh", mesh}, {"step", step}, {"state", "deleted"}});
  return Status::Ok();
}

}  // namespace tessera::service
