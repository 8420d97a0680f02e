// Verify: reads every chunk a checkpoint's index names, checks its checksum,
// and cross-checks each shard file's own chunk table against the index.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "storage/env.h"
#include "storage/thread_pool.h"

namespace tessera::storage {

struct BadChunk {
  std::string tensor;
  std::string file;
  uint64_t offset = 0;
  std::string error;
};

struct VerifyReport {
  uint64_t tensors = 0;
  uint64_t chunks_checked = 0;
  uint64_t bytes_checked = 0;  // stored bytes read
  std::vector<BadChunk> bad_chunks;
  std::vector<std::string> problems;  // file-level findings (missing shard, bad table)

  bool ok() const { return bad_chunks.empty() && problems.empty(); }
  Json ToJson() const;
};

// An unreadable index is an error; damaged shards are findings in the report.
// `progress(done_bytes, total_bytes)` is called as chunks are checked.
Result<VerifyReport> VerifyCheckpoint(
    Env* env, const std::string& dir, ThreadPool* pool = nullptr,
    const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

}  // namespace tessera::storage
