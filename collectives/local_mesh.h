// Whole groups inside one process, for tests, benchmarks and single-host demos.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/status.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

// A full TCP mesh of `size` ranks on 127.0.0.1: binds every listener on port 0,
// then joins all ranks concurrently. Element i is rank i.
Result<std::vector<std::unique_ptr<Transport>>> ConnectLoopbackMesh(
    int size, const std::string& group_id,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Runs fn(rank) for every rank in [0, size) on its own thread and joins them all.
void RunRanks(int size, const std::function<void(int rank)>& fn);

}  // namespace tessera::collectives
