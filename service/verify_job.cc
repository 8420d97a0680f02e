// A verify: every chunk of a committed checkpoint read back against its checksum
// (VerifyMachine, job_machines.h; the reading is Service::VerifyIo, job_loop.cc).
#include "service/job_machines.h"
#include "service/service.h"

namespace tessera::service {

Result<Json> Service::StartVerify(const std::string& mesh, const std::string& step) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
  auto m = meshes_.find(mesh);
  JobRecord* job = NewJob("verify", mesh, c->step, Json::object());
  MeshRecord record;  // only its name matters to a verify
  record.mesh.name = mesh;
  if (m != meshes_.end()) record = m->second;
  Launch(std::make_unique<VerifyMachine>(
      JobSpec::Of(job->id, std::move(record), c->step, options_.job_timeout_ms)));
  return Json{{"job", job->id}, {"checkpoint", c->Summary()}};
}

}  // namespace tessera::service
