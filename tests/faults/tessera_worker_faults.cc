// tessera-worker-faults: tessera-worker with the fault hooks of fault_hooks.h, for
// tests only. The same program (RunWorker), with faulty seams.
#include <cstdio>

#include "tests/faults/fault_hooks.h"
#include "worker/worker_program.h"

int main(int argc, char** argv) {
  auto hooks = tessera::faults::LoadFaultHooks("tessera-worker-faults", /*runs_tasks=*/true);
  if (!hooks.ok()) {
    std::fprintf(stderr, "error: %s\n", hooks.status().ToString().c_str());
    return 2;
  }
  tessera::worker::WorkerSeams seams;
  seams.env = hooks->env.get();
  seams.s3_transport = hooks->s3_transport;
  seams.around_task = hooks->TaskDelays();
  seams.after_memory_exchange = hooks->FlipMemoryCopy();
  return tessera::worker::RunWorker(argc, argv, seams);
}
