// The memory of one local shard: private heap memory, or a file in shared memory
// (/dev/shm) that the trainer maps too (numpy.memmap, torch.from_file(shared=True)),
// so that a save snapshots straight from the trainer's own tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "api/status.h"
#include "api/thread_annotations.h"

namespace tessera::worker {

class ShardBuffer {
 public:
  // Private memory of `bytes` bytes, uninitialized. Large buffers ask for
  // transparent huge pages: first-touch page faults dominate a fresh copy.
  // resource_exhausted when the memory is not there.
  static Result<std::shared_ptr<ShardBuffer>> Heap(size_t bytes);

  // Creates `dir`/`file_name` (mode 0600, must not exist), sizes it to `bytes`
  // (space reserved up front, so a full /dev/shm is an error here, not a SIGBUS
  // later) and maps it shared, zero-filled, its pages mapped in at once. The file
  // is unmapped and unlinked when the buffer is destroyed. Zero bytes: the file exists, nothing is mapped.
  static Result<std::shared_ptr<ShardBuffer>> Shm(const std::string& dir,
                                                  const std::string& file_name, size_t bytes);

  ~ShardBuffer();
  ShardBuffer(const ShardBuffer&) = delete;
  ShardBuffer& operator=(const ShardBuffer&) = delete;

  // Never null, even for zero bytes (so memcpy of 0 bytes stays defined).
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The shared-memory file; empty for heap buffers.
  const std::string& path() const { return path_; }
  bool mapped() const { return !path_.empty(); }

  // A mapping is read and written through data(), with GuardedCopy (guarded_copy.h:
  // the trainer may truncate its file): Shm populated it, so no page faults. A
  // snapshot's copy of 256 MiB written by the trainer takes 14-28 ms, about a memcpy,
  // where pread took 39-62 ms on the same virtual machine, and a restore's write
  // 14 ms where pwrite took 39 ms.

 private:
  friend class ShardBufferPool;
  enum class Kind { kEmpty, kMalloc, kAnonymousMap, kFileMap };

  static Result<std::unique_ptr<ShardBuffer>> NewHeap(size_t bytes);
  ShardBuffer(Kind kind, uint8_t* data, size_t size, std::string path)
      : kind_(kind), data_(data), size_(size), path_(std::move(path)) {}

  Kind kind_;
  uint8_t* data_;
  size_t size_;
  std::string path_;
};

// Recycles heap buffers by exact size so that repeated snapshots of the same
// tensors copy into already-faulted pages (a fresh copy costs several times a
// warm one). Buffers handed out return here when their last reference goes;
// the least recently returned are freed beyond `max_bytes`. Thread-safe.
class ShardBufferPool : public std::enable_shared_from_this<ShardBufferPool> {
 public:
  struct Stats {
    uint64_t allocated = 0;     // Acquire calls served by a new allocation
    uint64_t reused = 0;        // Acquire calls served from the pool
    uint64_t pooled_bytes = 0;  // bytes waiting in the pool now
    uint64_t reserved = 0;      // buffers added ahead of use by Reserve
  };

  static std::shared_ptr<ShardBufferPool> Create(size_t max_bytes);

  // A heap buffer of exactly `bytes`, with unspecified contents. It returns to
  // the pool when released (or is freed, if the pool is gone by then).
  Result<std::shared_ptr<ShardBuffer>> Acquire(size_t bytes);
  // Adds one buffer of `bytes` with its pages already faulted in, so that the
  // first snapshot of a shard of that size copies into warm memory like every
  // later one. A no-op beyond `max_bytes`; resource_exhausted without memory.
  Status Reserve(size_t bytes);
  // Frees the least recently returned buffers until at most `bytes` wait in the pool.
  void Trim(size_t bytes);
  Stats stats() const;

 private:
  explicit ShardBufferPool(size_t max_bytes) : max_bytes_(max_bytes) {}
  void Release(std::unique_ptr<ShardBuffer> buffer);
  // Moves the oldest buffers into *evicted until at most `bytes` wait.
  void EvictBeyond(size_t bytes, std::vector<std::unique_ptr<ShardBuffer>>* evicted) REQUIRES(mu_);

  using Lru = std::list<std::unique_ptr<ShardBuffer>>;

  const size_t max_bytes_;
  mutable Mutex mu_;
  Lru lru_ GUARDED_BY(mu_);  // oldest first
  std::multimap<size_t, Lru::iterator> by_size_ GUARDED_BY(mu_);
  Stats stats_ GUARDED_BY(mu_);
};

// Removes "tessera-<pid>-*" files in `dir` whose process no longer exists:
// mappings of workers that were killed before they could unlink them.
// Returns how many were removed.
int RemoveOrphanedShmFiles(const std::string& dir);

}  // namespace tessera::worker
