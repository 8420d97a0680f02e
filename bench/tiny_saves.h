// Tiny saves against the number of workers: real worker processes up to 32, in-process
// agents beyond (also with their shard files in memory when memory_env is set). One
// JSON line per worker count and kind (bench "tiny_save").
#pragma once

#include <vector>

#include "tools/local_cluster.h"

namespace tessera::bench {

void RunTinySaves(const tools::ClusterOptions& opts, const std::vector<int>& workers,
                  bool memory_env);

}  // namespace tessera::bench
