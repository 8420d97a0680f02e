// A whole sharded save and read in one process, for tools, tests and
// benchmarks: plan → each rank writes its shard + fragment → merge → commit.
// The distributed save (tesserad + workers) runs the same steps across processes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/mesh.h"
#include "storage/env.h"
#include "storage/index.h"
#include "storage/shard_writer.h"

namespace tessera::storage {

// Returns the row-major bytes of the local shard of tensor `t` on `device`.
using ShardSource = std::function<const void*(size_t t, int64_t device)>;

struct SaveRequest {
  std::string root;
  Mesh mesh;
  int64_t step = 0;
  std::vector<TensorMeta> tensors;
  ShardSource source;
  ShardOptions options;
  Json metadata = Json::object();
  std::string id = "local";  // staging id
};

struct SaveSummary {
  std::string dir;
  uint64_t logical_bytes = 0;  // bytes of the global tensors
  uint64_t written_raw_bytes = 0;  // slices written (replicas once)
  uint64_t stored_bytes = 0;   // bytes in shard files
  std::vector<uint64_t> bytes_per_rank;
};

// Saves and commits; on any failure removes the staging dir and returns the error.
Result<SaveSummary> SaveCheckpoint(Env* env, const SaveRequest& req);

// Reads `target` of tensor `name` from a committed checkpoint dir.
Result<std::string> ReadSlice(Env* env, const std::string& dir, const std::string& name,
                              const SliceSpec& target);

}  // namespace tessera::storage
