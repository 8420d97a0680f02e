// A restore, checked at the door: StartRestore plans every tensor from the
// checkpoint's record, so a restore that cannot work is a 400; then its machine
// (RestoreMachine, restore_machine.h) has every target worker read its devices' slices
// (any mesh, any layout) into its store.
#include <algorithm>

#include "api/names.h"
#include "service/restore_machine.h"
#include "service/restore_plan.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"

namespace tessera::service {
namespace {

// The tensors to restore and the target mesh's ranks that restore them: everything a
// restore needs is checked here (tensors, dtypes, shapes, layouts, workers).
Result<std::pair<std::vector<TensorMeta>, std::vector<int64_t>>> PlanRestore(
    const CheckpointRecord& c, const MeshRecord& t, const RestoreRequest& request) {
  const std::string& target_mesh = t.mesh.name;
  // Only the workers asked for restore (a trainer restoring its own host).
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < t.mesh.num_workers(); ++r) {
    if (!request.workers || std::count(request.workers->begin(), request.workers->end(),
                                       t.workers[r])) {
      ranks.push_back(r);
    }
  }
  for (const std::string& w : request.workers.value_or(std::vector<std::string>{})) {
    if (std::find(t.workers.begin(), t.workers.end(), w) == t.workers.end()) {
      return InvalidArgument("worker " + w + " is not a worker of mesh " + target_mesh,
                             {{"field", "workers"}, {"worker", w}, {"mesh", target_mesh}});
    }
  }
  const std::string what = "checkpoint " + c.mesh + " step " + std::to_string(c.step);
  std::vector<TensorMeta> saved;
  for (const Json& tj : c.tensors) {
    auto meta = TensorMetaFromJson(tj);
    if (!meta.ok()) return meta.status().WithContext("the catalog's record of " + what);
    saved.push_back(std::move(*meta));
  }
  ASSIGN_OR_RETURN(auto tensors, PlanRestoreTensors(saved, request, t.mesh, what));
  return std::make_pair(std::move(tensors), std::move(ranks));
}

}  // namespace


Result<Json> Service::StartRestore(const std::string& mesh, const std::string& step,
                                   const RestoreRequest& request) {
  const std::string job_id = NewJobId();
  const std::string target_mesh = request.target_mesh.value_or(mesh);
  ASSIGN_OR_RETURN(CheckpointRecord c, checkpoints_.Hold(mesh, step, job_id));
  auto t = meshes_.Hold(target_mesh, job_id, "target_mesh");
  if (!t.ok()) {
    checkpoints_.Release(c.key(), job_id);
    return t.status();
  }
  // The machine's mesh is the target; the step is the source checkpoint's.
  JobSpec spec = JobSpec::Of(job_id, *t, c.step, options_.job_timeout_ms);
  spec.checkpoint_mesh = mesh;
  spec.holds_mesh = true;
  spec.held_checkpoint = c.key();
  auto planned = PlanRestore(c, *t, request);
  if (!planned.ok()) {
    ReleaseHolds(spec);
    return planned.status();
  }
  Json recorded = request.ToJson();
  recorded["target_mesh"] = target_mesh;
  RETURN_IF_ERROR(CreateJob(spec, "restore", mesh, recorded));
  Launch(std::make_unique<RestoreMachine>(std::move(spec), std::move(planned->first),
                                          std::move(planned->second)));
  return Json{{"job", job_id}, {"checkpoint", c.Summary()}};
}

}  // namespace tessera::service
