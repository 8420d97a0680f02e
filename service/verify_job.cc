// A verify: every chunk of a committed checkpoint read back against its checksum
// (VerifyMachine, verify_machine.h; the reading is Service::VerifyIo, job_loop.cc).
#include "service/verify_machine.h"
#include "service/service.h"

namespace tessera::service {

Result<Json> Service::StartVerify(const std::string& mesh, const std::string& step) {
  const std::string job_id = NewJobId();
  ASSIGN_OR_RETURN(CheckpointRecord c, checkpoints_.Hold(mesh, step, job_id));
  MeshRecord record;  // only its name matters to a verify; the mesh may be gone
  record.mesh.name = mesh;
  if (auto m = meshes_.Get(mesh); m.ok()) record = *m;
  JobSpec spec = JobSpec::Of(job_id, std::move(record), c.step, options_.job_timeout_ms);
  spec.held_checkpoint = c.key();
  RETURN_IF_ERROR(CreateJob(spec, "verify", mesh, Json::object()));
  Launch(std::make_unique<VerifyMachine>(std::move(spec)));
  return Json{{"job", job_id}, {"checkpoint", c.Summary()}};
}

}  // namespace tessera::service
