// tesserad-faults: tesserad with the fault hooks of fault_hooks.h (a disk that fills
// up, failing S3 requests), for tests only. The same program (RunTesserad), with
// faulty seams.
#include <cstdio>

#include "service/tesserad_program.h"
#include "tests/faults/fault_hooks.h"

int main(int argc, char** argv) {
  auto hooks = tessera::faults::LoadFaultHooks("tesserad-faults", /*runs_tasks=*/false);
  if (!hooks.ok()) {
    std::fprintf(stderr, "error: %s\n", hooks.status().ToString().c_str());
    return 2;
  }
  tessera::service::ServerSeams seams;
  seams.env = hooks->env.get();
  seams.s3_transport = hooks->s3_transport;
  seams.after_poll = hooks->DropPolls();
  return tessera::service::RunTesserad(argc, argv, seams);
}
