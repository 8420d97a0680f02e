// One writer's part of a sharded save (SaveV2 in seed 001): its slices go into
// shard-<rank>.tsr and its index part into fragment-<rank>.sqlite, both fsynced.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/env.h"
#include "storage/index.h"
#include "storage/shard_writer.h"

namespace tessera::storage {

struct SliceToWrite {
  TensorMeta tensor;
  SliceSpec slice;
  const void* data = nullptr;  // the slice's row-major bytes
  size_t bytes = 0;
};

struct RankWriteResult {
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
};

// REQUIRES: `staging` exists; every `data` stays valid during the call.
Result<RankWriteResult> WriteRank(Env* env, const std::string& staging, int64_t rank,
                                  const std::vector<SliceToWrite>& slices,
                                  const ShardOptions& options);

}  // namespace tessera::storage
