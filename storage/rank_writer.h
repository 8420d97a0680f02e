// One writer's part of a sharded save (SaveV2 in seed 001): its slices go into one
// shard file, and its part of the index is a fragment: as data (WriteShard, what a
// worker's join carries) or as fragment-<rank>.sqlite beside the shard (WriteRank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/env.h"
#include "storage/fragment_json.h"
#include "storage/index.h"
#include "storage/shard_writer.h"

namespace tessera::storage {

struct SliceToWrite {
  TensorMeta tensor;
  SliceSpec slice;
  const void* data = nullptr;  // the slice's row-major bytes
  size_t bytes = 0;
  // When set (and data null), the bytes are read through it, chunk by chunk.
  SliceReader read = {};
  // The slice's chunks in the checkpoint an incremental save builds on (ShardWriter::Add);
  // null: every chunk is written.
  const std::vector<SliceChunk>* base = nullptr;
};

struct RankWriteResult {
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
};

struct ShardWritten {
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  uint64_t reused_bytes = 0;  // raw bytes of chunks that refer to a base
  bool wrote_file = false;    // false when every chunk refers to a base
  std::vector<FragmentSlice> fragment;  // the slices, as stored in `file` (or their base)
};

// Writes `slices` into `staging`/`file` and fsyncs it. REQUIRES: `staging` exists;
// every `data` (and `base`) stays valid during the call.
Result<ShardWritten> WriteShard(Env* env, const std::string& staging, const std::string& file,
                                const std::vector<SliceToWrite>& slices,
                                const ShardOptions& options);

// WriteShard into shard-<rank>.tsr, and its fragment into fragment-<rank>.sqlite.
Result<RankWriteResult> WriteRank(Env* env, const std::string& staging, int64_t rank,
                                  const std::vector<SliceToWrite>& slices,
                                  const ShardOptions& options);

}  // namespace tessera::storage
