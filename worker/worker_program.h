// tessera-worker as a function of its command line and its seams, so that the shipped
// program (tessera_worker.cc, default seams) and the test program that injects faults
// (tests/faults) run the same code, and only the latter links any fault.
#pragma once

#include <memory>

#include "storage/env.h"
#include "storage/s3/transport.h"
#include "worker/agent.h"

namespace tessera::worker {

struct WorkerSeams {
  storage::Env* env = nullptr;                           // null: storage::DefaultEnv()
  std::shared_ptr<storage::s3::Transport> s3_transport;  // null: libcurl
  TaskRunner around_task;                                // null: tasks just run
  std::function<void(MemoryCheckpoint&)> after_memory_exchange;  // null: nothing
};

// Parses the command line, serves until SIGINT or SIGTERM; the process's exit status.
// REQUIRES: called once per process (it installs signal handlers).
int RunWorker(int argc, char** argv, const WorkerSeams& seams);

}  // namespace tessera::worker
