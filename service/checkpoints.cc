// The checkpoints of a mesh in the catalog: list, detail, delete, and the lookup of a
// committed step ("latest" or a number) that restores and verifies start from.
#include <algorithm>

#include "api/names.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"

namespace tessera::service {

Result<CheckpointRecord*> Service::FindCommitted(const std::string& mesh, const std::string& step) {
  if (step == "latest") {
    CheckpointRecord* best = nullptr;
    for (auto& [k, c] : checkpoints_) {
      if (c.mesh == mesh && c.state == CheckpointState::kCommitted && (!best || c.step > best->step)) best = &c;
    }
    if (!best) return NotFound("mesh " + mesh + " has no committed checkpoint", {{"mesh", mesh}});
    return best;
  }
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  auto it = checkpoints_.find(CheckpointRecord::Key(mesh, s));
  if (it == checkpoints_.end()) {
    return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(s),
                    {{"mesh", mesh}, {"step", s}});
  }
  if (it->second.state != CheckpointState::kCommitted) {
    return Conflict("checkpoint " + mesh + " step " + std::to_string(s) + " is " +
                        StateString(it->second.state) + ", not committed",
                    {{"mesh", mesh}, {"step", s}, {"state", it->second.state}});
  }
  return &it->second;
}

Result<Json> Service::ListCheckpoints(const std::string& mesh) {
  MutexLock lock(mu_);
  std::vector<const CheckpointRecord*> list;
  for (const auto& [k, c] : checkpoints_) {
    if (c.mesh == mesh) list.push_back(&c);
  }
  if (list.empty() && !meshes_.count(mesh)) return NotFound("no mesh " + mesh, {{"mesh", mesh}});
  std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->step > b->step; });
  Json out = Json::array();
  for (auto* c : list) out.push_back(c->Summary());
  return out;
}

Result<Json> Service::GetCheckpoint(const std::string& mesh, const std::string& step) {
  MutexLock lock(mu_);
  if (step == "latest") {
    ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
    return c->ToJson();
  }
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  auto it = checkpoints_.find(CheckpointRecord::Key(mesh, s));
  if (it == checkpoints_.end()) {
    return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(s),
                    {{"mesh", mesh}, {"step", s}});
  }
  return it->second.ToJson();
}

Status Service::DeleteCheckpoint(const std::string& mesh, const std::string& step_text) {
  ASSIGN_OR_RETURN(int64_t step, ParseStep(step_text));
  const std::string key = CheckpointRecord::Key(mesh, step);
  {
    MutexLock lock(mu_);
    auto it = checkpoints_.find(key);
    if (it == checkpoints_.end()) {
      return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(step),
                      {{"mesh", mesh}, {"step", step}});
    }
    if (it->second.state != CheckpointState::kCommitted &&
        it->second.state != CheckpointState::kFailed) {
      return Conflict("checkpoint is being saved by job " + it->second.job,
                      {{"job", it->second.job}});
    }
    for (const std::string& id : active_jobs_) {
      const JobRecord& j = jobs_.at(id);
      if (j.mesh == mesh && j.step == step) {
        return Conflict("job " + id + " is using this checkpoint", {{"job", id}});
      }
    }
  }
  Status st = storage::DeleteCheckpoint(env_, options_.checkpoint_root, mesh, step);
  if (!st.ok() && st.code() != Code::kNotFound) return st;
  MutexLock lock(mu_);
  checkpoints_.erase(key);
  RETURN_IF_ERROR(catalog_->Delete("checkpoints", key));
  events_.Publish("checkpoint", {{"mesh", mesh}, {"step", step}, {"state", "deleted"}});
  return Status::Ok();
}

}  // namespace tessera::service
