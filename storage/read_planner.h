// Read planning: for a target slice of a saved tensor (any mesh or layout), the
// minimal set of chunk reads that cover it, and their assembly into a
// row-major target buffer. A chunk is read only if some byte of it lands in
// the target, so resharding reads only what overlaps.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "storage/index.h"
#include "storage/mapped_file.h"
#include "storage/shard_reader.h"
#include "storage/slice_copy.h"
#include "storage/thread_pool.h"

namespace tessera::storage {

struct ChunkRead {
  const SliceEntry* source = nullptr;  // the saved slice the chunk belongs to
  SliceChunk chunk;
};

struct ReadPlan {
  const TensorEntry* tensor = nullptr;
  SliceSpec target;
  std::vector<ChunkRead> reads;
  uint64_t stored_bytes = 0;  // bytes read from disk
  uint64_t raw_bytes = 0;     // bytes decoded
};

// Plans the reads for `target` (a slice of the tensor's global shape).
// A target outside the tensor is invalid_argument; a target the saved slices
// do not cover is data_loss.
Result<ReadPlan> PlanRead(const TensorEntry& tensor, const SliceSpec& target);

// A raw chunk that lands whole in one contiguous run of a plan's target: its bytes
// in the shard file are the target's bytes [target_offset, + loc.raw_length).
struct DirectChunk {
  const std::string* file = nullptr;  // the shard file's name
  ChunkLocation loc;
  uint64_t target_offset = 0;
};
// The plan's chunks in target order when every one is raw and they tile the target
// exactly (a slice read as saved, or whole rows of a row-sharded tensor); empty
// otherwise (then ExecuteRead assembles the target).
std::vector<DirectChunk> DirectChunks(const ReadPlan& plan);

// Opens shard files of one checkpoint directory once and shares them.
class ShardCache {
 public:
  ShardCache(Env* env, std::string dir) : env_(env), dir_(std::move(dir)) {}
  Result<const ShardReader*> Get(const std::string& file);
  // The shard file mapped into memory (Env::MapFile), or null where it cannot be (an
  // object store, an Env in memory, a failed map): the caller reads instead.
  const MappedFile* Map(const std::string& file);
  const std::string& dir() const { return dir_; }

 private:
  Env* env_;
  std::string dir_;
  Mutex mu_;
  std::map<std::string, std::unique_ptr<ShardReader>> readers_ GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<MappedFile>> maps_ GUARDED_BY(mu_);
};

// Executes `plan` into `out` (target.NumElements() * dtype size bytes), verifying
// every chunk. Decodes on `pool` when given. Errors name the tensor and file.
Status ExecuteRead(const ReadPlan& plan, ShardCache* shards, void* out, size_t out_bytes,
                   ThreadPool* pool = nullptr);

}  // namespace tessera::storage
