// Writes one shard file: slices are cut into chunks, encoded on a thread pool
// while the calling thread writes finished chunks in order.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/env.h"
#include "storage/shard_format.h"
#include "storage/thread_pool.h"

namespace tessera::storage {

struct ShardOptions {
  uint64_t chunk_size = kDefaultChunkSize;  // rounded down to a multiple of 8, at least 8
  bool compress = true;                     // zstd, or raw for everything
  int level = 1;                            // zstd level
  ThreadPool* pool = nullptr;               // null: encode on the calling thread
  // Compression must save at least min_savings of a chunk's bytes, else the
  // chunk is stored raw; a slice larger than sample_bytes is first sampled, and
  // if the sample does not pay the whole slice is stored raw without trying.
  // Float32 weights save ~8% at the cost of both cores — slower than the disk —
  // while bfloat16 saves ~22%.
  double min_savings = 0.10;
  size_t sample_bytes = 256 << 10;
  // Called after each chunk is written with the raw bytes written so far.
  std::function<void(uint64_t)> on_progress;
};

// One chunk of a slice: the raw byte range [raw_offset, raw_offset + loc.raw_length)
// of the slice's row-major bytes, stored at `loc` of the slice's shard file, or, for a
// chunk an incremental save did not write again, of `file`: "../<dir>/<name>", a shard
// file of an earlier checkpoint of the mesh (docs/format.md, "Incremental checkpoints").
struct SliceChunk {
  uint64_t raw_offset = 0;
  ChunkLocation loc;
  std::string file;  // empty: the slice's own file
};

// Reads bytes [offset, offset + n) of a slice into `dst` (a slice that is not in
// this process's memory: ShardWriter::Add with a reader). An error fails the write.
using SliceReader = std::function<Status(uint64_t offset, size_t n, void* dst)>;

class ShardWriter {
 public:
  static Result<std::unique_ptr<ShardWriter>> Create(Env* env, const std::string& path,
                                                     ShardOptions options);
  // Waits for encodes still running (they read caller memory). Does not Finish.
  ~ShardWriter();

  // Queues one slice's raw bytes, of `width`-byte floats for the float codec
  // (PlaneWidth; 0: not floats). REQUIRES: `data` stays valid until Finish()
  // returns. Returns the slice's handle for chunks(). Errors are sticky.
  // `base`: the same slice's chunks in an earlier checkpoint (their `file` set, cut at
  // the same chunk size); a chunk whose checksum equals the base chunk at its place is
  // not written but refers to it.
  Result<size_t> Add(const void* data, size_t n, int width = 0,
                     const std::vector<SliceChunk>* base = nullptr);
  // The same for a slice read through `read`, one chunk at a time into buffers of
  // this writer (as many as chunks in flight): its bytes are never all in memory.
  Result<size_t> Add(const SliceReader& read, size_t n, int width = 0,
                     const std::vector<SliceChunk>* base = nullptr);
  // Writes the remaining chunks, the table and trailer, then fsyncs and closes. The file
  // is created at the first chunk written: when every chunk refers to a base, there is
  // none (written() is false).
  Status Finish();

  // Chunks of slice `handle`, valid after Finish().
  const std::vector<SliceChunk>& chunks(size_t handle) const { return slices_[handle]; }
  uint64_t stored_bytes() const { return offset_; }
  uint64_t raw_bytes() const { return raw_done_; }
  // Raw bytes of the chunks that refer to a base instead of being written.
  uint64_t reused_bytes() const { return reused_; }
  bool written() const { return file_ != nullptr || !table_.empty(); }
  const std::string& path() const { return path_; }

 private:
  struct Encoded {
    EncodedChunk chunk;
    const SliceChunk* reused = nullptr;  // the base chunk it equals
    Status read = Status::Ok();          // a reader's error: the chunk has no bytes
  };
  struct Pending {
    size_t slice;
    uint64_t raw_offset;
    const char* src;
    size_t n;
    char* out;  // one of buffers_, holding the compressed bytes
    std::future<Encoded> encoded;
  };

  ShardWriter(Env* env, std::string path, ShardOptions options);
  Status Open();  // creates the file and writes its header
  // Add with either `data` or `read`.
  Result<size_t> AddSlice(const char* data, const SliceReader* read, size_t n, int width,
                          const std::vector<SliceChunk>* base);
  Status WriteFront();
  void Drain();

  Env* env_;
  std::unique_ptr<WritableFile> file_;
  std::string path_;
  ShardOptions options_;
  size_t max_inflight_;
  std::deque<Pending> pending_;
  // Compression output, reused round-robin: one per chunk that can be in flight.
  std::vector<std::unique_ptr<char[]>> buffers_;
  size_t buffer_capacity_ = 0;
  // Raw chunks of slices read through a SliceReader, the same round-robin; made at
  // the first such slice.
  std::vector<std::unique_ptr<char[]>> inputs_;
  uint64_t next_buffer_ = 0;
  std::vector<std::vector<SliceChunk>> slices_;
  std::vector<ChunkLocation> table_;
  uint64_t offset_ = 0;
  uint64_t raw_done_ = 0;
  uint64_t reused_ = 0;
  Status error_;
  bool finished_ = false;
};

}  // namespace tessera::storage
