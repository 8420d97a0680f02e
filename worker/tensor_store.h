// The tensors a worker holds for the trainers on its host, keyed by (mesh, name):
// one buffer per local device shard, pushed by the trainer (PUT), shared with it
// through a /dev/shm mapping, snapshotted by saves and written by restores.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/dtype.h"
#include "api/mesh.h"
#include "api/shape.h"
#include "api/status.h"
#include "api/tensor_desc.h"
#include "api/thread_annotations.h"
#include "worker/borrowed_memory.h"
#include "worker/mesh_placement.h"
#include "worker/shard_buffer.h"

namespace tessera::storage {
class ThreadPool;
}

namespace tessera::worker {

using ::tessera::TensorDesc;

struct TensorStoreOptions {
  std::string shm_dir = "/dev/shm";
  // File names are "<prefix>-<n>-d<device>-<name>"; empty means "tessera-<pid>".
  std::string shm_prefix;
  // Threads that copy a snapshot (the calling thread counts as one).
  int copy_threads = 2;
  // Freed snapshot buffers kept for reuse, at most this many bytes.
  size_t snapshot_pool_bytes = size_t{8} << 30;
};

// A shard as Get returns it. A heap buffer never changes once stored (a Put
// replaces it); a mapped one is the trainer's memory and changes under the reader.
// (A borrowed shard is not returned: Get names it.)
struct ShardRef {
  TensorDesc desc;
  Shape local_shape;
  std::shared_ptr<const ShardBuffer> buffer;
};

// The answer to Map: the file the trainer maps, and its size.
struct ShardMapping {
  std::string path;
  size_t bytes = 0;
  Shape local_shape;
};

struct TensorInfo {
  std::string mesh;
  std::string name;
  TensorDesc desc;
  std::vector<int64_t> devices;  // local devices holding a shard, ascending
  bool mapped = false;           // some shard lives in a /dev/shm mapping
};

// The Checksum64 (guarded_copy.h) of a snapshot's shards, by (tensor, device), where known.
using ShardChecksums = std::map<std::pair<std::string, int64_t>, uint64_t>;
// The checksum of (tensor, device) in `sums`, or null (also when `sums` is).
const uint64_t* ChecksumOf(const ShardChecksums* sums, const std::string& tensor, int64_t device);
// Whether `n` bytes at `src` hold `base`'s (n bytes): their first block compared, then,
// with `expected` (base's Checksum64), the checksum of src; else every byte. False
// when src vanished (a truncated mapping); *equal says.
bool SameAsBase(const uint8_t* src, const uint8_t* base, size_t n, const uint64_t* expected, bool* equal);

// Private copies of a mesh's tensors at one instant. Nothing the trainer does
// after TakeSnapshot returns (Put, writes into its mappings, Delete) changes it.
struct Snapshot {
  struct Shard {
    int64_t device = 0;
    std::shared_ptr<const ShardBuffer> buffer;  // null when borrowed
    // The trainer's memory, read in place (borrowed_snapshot.h); null when copied.
    std::shared_ptr<const BorrowedMemory> borrowed = nullptr;

    size_t size() const { return buffer ? buffer->size() : borrowed ? borrowed->size() : 0; }
  };
  struct Tensor {
    std::string name;
    TensorDesc desc;
    std::vector<Shard> shards;            // ascending device
    std::vector<int64_t> absent_devices;  // local devices that had no shard
  };

  MeshPlacement placement;
  std::vector<Tensor> tensors;  // ascending name

  // The named tensor, or nullptr.
  const Tensor* Find(std::string_view name) const;
  uint64_t bytes() const;
  // Some shard is the trainer's memory, read in place.
  bool borrows() const;
  // The shard of (name, device) in `base` whose bytes `shard` may share: same
  // description, device and size; null when there is none.
  static const Shard* BaseShard(const Snapshot* base, const Tensor& t, const Shard& shard);
  // Whether `shard` of `t` is the same buffer as its shard in `base` (shared, not copied).
  static bool SharedWith(const Snapshot* base, const Tensor& t, const Shard& shard);
};

// Thread-safe. One mutex guards the table and is held only to look up or swap
// shared_ptrs; bytes are copied outside it.
class TensorStore {
 public:
  explicit TensorStore(MeshResolver resolver, TensorStoreOptions options = {});
  ~TensorStore();
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  // Where this worker stands in `mesh`: its rank and the devices it owns;
  // not_found for a mesh it is not part of.
  Result<MeshPlacement> Placement(const std::string& mesh) const { return resolver_(mesh); }

  // Stores `bytes` as the shard of `device` (a global device id this worker
  // owns in `mesh`). invalid_argument naming the field for a bad name, unowned
  // device, layout or byte count (NumElements(local shape) × dtype size);
  // not_found for an unknown mesh; conflict naming both descriptions when the
  // tensor exists differently (DELETE it first). A mapped shard is written in
  // place, so the trainer's view stays valid; a heap shard is replaced.
  Status Put(const std::string& mesh, const std::string& name, const TensorDesc& desc,
             int64_t device, std::string_view bytes);

  // Moves the shard of `device` into a /dev/shm file (same checks as Put) and
  // returns its path; the bytes already held are kept, a new shard is zeros.
  // Idempotent. The file goes away with the tensor (Delete, store destruction).
  // A new mapping also adds a faulted-in snapshot buffer of its size to the
  // pool, so the first save of it stalls no longer than later ones.
  Result<ShardMapping> Map(const std::string& mesh, const std::string& name, const TensorDesc& desc,
                           int64_t device);

  // not_found naming the tensor or the device when absent.
  Result<ShardRef> Get(const std::string& mesh, const std::string& name, int64_t device) const;
  // The trainer's mapped shard of `device` when the tensor is held with exactly `desc`
  // (a restore may receive its bytes straight into it), else null.
  std::shared_ptr<ShardBuffer> MappedShard(const std::string& mesh, const std::string& name,
                                           const TensorDesc& desc, int64_t device) const;
  // Like Get, and copies the bytes into *bytes, never torn by a concurrent
  // Put or Install (a trainer writing its mapping meanwhile is its own race).
  Result<ShardRef> Read(const std::string& mesh, const std::string& name, int64_t device,
                        std::string* bytes) const;

  // Every tensor, ordered by (mesh, name).
  std::vector<TensorInfo> List() const;

  // Drops the tensor and its shards (unlinking its mappings). not_found if absent.
  Status Delete(const std::string& mesh, const std::string& name);

  // Copies every tensor of `mesh` (or only `names`; an unknown one is not_found
  // naming it) into private buffers, with up to copy_threads threads. This is
  // the trainer's stall during a save: when it returns, the trainer may
  // overwrite its tensors without affecting the snapshot. Buffers come from a
  // pool, so repeated saves of the same tensors do not fault pages in again.
  // Puts and Installs into mappings wait for the copy; the trainer must not write into its
  // mappings until it returns (that is the stall /v1/save imposes).
  Result<std::shared_ptr<const Snapshot>> TakeSnapshot(
      const std::string& mesh, const std::optional<std::vector<std::string>>& names = {});
  // The same for a placement the caller knows (a snapshot task names the mesh and
  // this worker's rank): no lookup of the mesh.
  // With `base` (a memory checkpoint's snapshot before), a shard whose bytes equal
  // its shard in `base` (same tensor, description, device and size) is not copied:
  // the snapshot shares base's buffer (Snapshot::SharedWith says which). Compared
  // whole, or, where `base_sums` has base's checksum, by its first block and then its
  // checksum (one pass over the trainer's bytes instead of two; equal checksums taken
  // as equal bytes, as incremental disk saves do).
  Result<std::shared_ptr<const Snapshot>> TakeSnapshot(
      const MeshPlacement& placement, const std::optional<std::vector<std::string>>& names,
      const Snapshot* base = nullptr, const ShardChecksums* base_sums = nullptr);

  // Lends the trainer's memory (borrowed_memory.h) as the shard of `device`: a
  // restore's Install writes into it, a snapshot reads it in place. Checks as Put,
  // and its size must be the shard's; a shard held before is dropped; a tensor held
  // with another description is conflict. EndLoans ends the loan.
  Status Borrow(const std::string& mesh, const std::string& name, const TensorDesc& desc,
                int64_t device, std::shared_ptr<const BorrowedMemory> memory);
  // Drops the tensors `names` of `mesh` and returns once no write into memory they
  // borrowed is under way: the trainer may free it then.
  void EndLoans(const std::string& mesh, const std::vector<std::string>& names);

  // Restore's write: checks as Put, then writes into the existing shard (keeping
  // mappings valid) or creates the tensor. A tensor that exists with another
  // description is invalid_argument naming it and both dtypes/shapes. With
  // `checksum`, it receives the Checksum64 (guarded_copy.h) of the bytes as written,
  // taken in the same pass over them.
  Status Install(const std::string& mesh, const std::string& name, const TensorDesc& desc,
                 int64_t device, const void* data, size_t n, uint64_t* checksum = nullptr);

  // Adds to the snapshot pool, faulted in, one buffer of each size `like` holds (a
  // size twice, twice): the memory tier keeps its snapshots, so without this each of
  // a mesh's first memory checkpoints would copy into fresh pages, a fault per page
  // while the trainer waits (Agent::ReserveRing). Called off the trainer's path.
  Status ReserveLike(const Snapshot& like);
  // Frees the snapshot pool's idle buffers beyond `bytes` (the oldest first).
  void TrimSnapshotPool(size_t bytes) { pool_->Trim(bytes); }
  // A buffer of `bytes` from the snapshot pool (for a snapshot taken elsewhere).
  Result<std::shared_ptr<ShardBuffer>> AcquireSnapshotBuffer(size_t bytes) { return pool_->Acquire(bytes); }

  // Reuse counters of the snapshot buffer pool (tests, metrics).
  ShardBufferPool::Stats snapshot_pool_stats() const { return pool_->stats(); }

 private:
  using Key = std::pair<std::string, std::string>;  // (mesh, name)
  struct Entry {
    TensorDesc desc;
    Shape local_shape;
    std::map<int64_t, std::shared_ptr<ShardBuffer>> shards;  // by global device
    // Shards lent by the trainer (Borrow), by global device; none is also in shards.
    std::map<int64_t, std::shared_ptr<const BorrowedMemory>> borrowed = {};
  };
  // What the checks of Put / Map / Install establish.
  struct Checked {
    Shape local_shape;
    size_t bytes = 0;
  };
  // A contiguous copy; a snapshot is a list of these, split across threads.
  struct CopyRun {
    const uint8_t* src;
    uint8_t* dst;
    size_t bytes;
    // The shared-memory mapping that src or dst is in, if any: named when it shrinks.
    const ShardBuffer* mapping = nullptr;
    // A comparison instead of a copy: src against `base` (dst unused); *differs is
    // set when they are not the same.
    const uint8_t* base = nullptr;
    std::atomic<bool>* differs = nullptr;
    const uint64_t* expected = nullptr;  // base's checksum: compared by it, never split

    bool Copy() const;  // GuardedCopy: false when a mapping shrank under it
  };

  Result<Checked> Check(const std::string& mesh, const std::string& name, const TensorDesc& desc,
                        int64_t device) const;
  // Put and Install: `mismatch` is the code for an existing, different description.
  // With `checksum`, it receives the Checksum64 of the bytes written (one pass).
  Status Write(const std::string& mesh, const std::string& name, const TensorDesc& desc,
               int64_t device, const void* data, size_t n, Code mismatch, uint64_t* checksum = nullptr);
  // Status for a request whose description differs from the stored one.
  static Status Mismatch(Code code, const Key& key, const TensorDesc& have, const TensorDesc& want);
  // A fresh file name for a mapping.
  std::string ShmFileName(const std::string& name, int64_t device) REQUIRES(mu_);
  // Copies every run, on copy_pool_ and the calling thread when it is worth it.
  // Conflict naming the mapping when one shrank under a copy (its file truncated).
  Status CopyParallel(const std::vector<CopyRun>& runs);
  // One run; with `checksum`, copied by one thread and checksummed as it lands.
  Status CopyChecked(const CopyRun& run, uint64_t* checksum);
  static Status Shrank(const ShardBuffer* mapping);

  const MeshResolver resolver_;
  const TensorStoreOptions options_;
  const std::shared_ptr<ShardBufferPool> pool_;
  std::unique_ptr<storage::ThreadPool> copy_pool_;  // copy_threads - 1 helpers, or null

  mutable Mutex mu_;
  std::map<Key, Entry> tensors_ GUARDED_BY(mu_);
  uint64_t next_file_ GUARDED_BY(mu_) = 0;

  // Shared by readers of shard bytes (snapshots, Read), exclusive for writes
  // into a shard that is already published (a mapping): reads never see them torn.
  mutable std::shared_mutex bytes_mu_;
};

}  // namespace tessera::worker
