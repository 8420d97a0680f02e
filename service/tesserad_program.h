// tesserad as a function of its command line and its seams, so that the shipped
// program (tesserad.cc, default seams) and the test program that injects faults
// (tests/faults) run the same code, and only the latter links any fault.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "api/status.h"
#include "storage/env.h"
#include "storage/s3/transport.h"

namespace tessera::service {

struct ServerSeams {
  storage::Env* env = nullptr;                           // null: storage::DefaultEnv()
  std::shared_ptr<storage::s3::Transport> s3_transport;  // null: libcurl
  // ServiceOptions::after_poll: an error loses a long-poll's answer. Null: none.
  std::function<Status(const std::string& worker, size_t tasks)> after_poll;
};

// Parses the command line, serves until SIGINT or SIGTERM (or a lost lease: 3); the
// process's exit status. REQUIRES: called once per process, before any other thread
// starts (it blocks the stop signals, which its threads inherit).
int RunTesserad(int argc, char** argv, const ServerSeams& seams);

}  // namespace tessera::service
