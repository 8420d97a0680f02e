// A restore, checked at the door: StartRestore plans every tensor from the
// checkpoint's record, so a restore that cannot work is a 400; then its machine
// (RestoreMachine, job_machines.h) has every target worker read its devices' slices
// (any mesh, any layout) into its store.
#include <algorithm>

#include "api/names.h"
#include "service/job_machines.h"
#include "service/restore_plan.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"

namespace tessera::service {

Result<Json> Service::StartRestore(const std::string& mesh, const std::string& step,
                                   const RestoreRequest& request) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
  const std::string target_mesh = request.target_mesh.value_or(mesh);
  ASSIGN_OR_RETURN(const MeshRecord* t, ReadyMesh(target_mesh, "target_mesh"));
  // Only the workers asked for restore (a trainer restoring its own host).
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < t->mesh.num_workers(); ++r) {
    if (!request.workers || std::count(request.workers->begin(), request.workers->end(),
                                       t->workers[r])) {
      ranks.push_back(r);
    }
  }
  for (const std::string& w : request.workers.value_or(std::vector<std::string>{})) {
    if (std::find(t->workers.begin(), t->workers.end(), w) == t->workers.end()) {
      return InvalidArgument("worker " + w + " is not a worker of mesh " + target_mesh,
                             {{"field", "workers"}, {"worker", w}, {"mesh", target_mesh}});
    }
  }
  std::vector<TensorMeta> saved;
  for (const Json& tj : c->tensors) {
    auto meta = TensorMetaFromJson(tj);
    if (!meta.ok()) {
      return meta.status().WithContext("the catalog's record of checkpoint " + mesh + " step " +
                                       std::to_string(c->step));
    }
    saved.push_back(std::move(*meta));
  }
  ASSIGN_OR_RETURN(auto tensors,
                   PlanRestoreTensors(saved, request, t->mesh,
                                      "checkpoint " + mesh + " step " + std::to_string(c->step)));
  Json recorded = request.ToJson();
  recorded["target_mesh"] = target_mesh;
  JobRecord* job = NewJob("restore", mesh, c->step, recorded);
  // The machine's mesh is the target; the step is the source checkpoint's.
  JobSpec spec = JobSpec::Of(job->id, *t, c->step, options_.job_timeout_ms);
  spec.checkpoint_mesh = mesh;
  Launch(std::make_unique<RestoreMachine>(std::move(spec), std::move(tensors), std::move(ranks)));
  return Json{{"job", job->id}, {"checkpoint", c->Summary()}};
}

}  // namespace tessera::service
