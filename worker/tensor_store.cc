#include "worker/tensor_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <set>

#include "api/json_codec.h"
#include "api/names.h"
#include "storage/thread_pool.h"
#include "worker/guarded_copy.h"

namespace tessera::worker {
namespace {

// Below this many bytes a copy is not worth handing to other threads.
constexpr size_t kParallelCopyMin = size_t{1} << 20;
// What SameAsBase compares byte for byte before it checksums the rest.
constexpr size_t kCompareHead = size_t{64} << 10;
// Part of the tensor name kept in a shm file name (NAME_MAX is 255).
constexpr size_t kFileNameTensorChars = 80;

TensorStoreOptions WithDefaults(TensorStoreOptions options) {
  if (options.shm_prefix.empty()) options.shm_prefix = "tessera-" + std::to_string(getpid());
  return options;
}

}  // namespace

TensorStore::TensorStore(MeshResolver resolver, TensorStoreOptions options)
    : resolver_(std::move(resolver)),
      options_(WithDefaults(std::move(options))),
      pool_(ShardBufferPool::Create(options_.snapshot_pool_bytes)) {
  if (options_.copy_threads > 1) {
    copy_pool_ = std::make_unique<storage::ThreadPool>(options_.copy_threads - 1);
  }
}

TensorStore::~TensorStore() = default;

Result<TensorStore::Checked> TensorStore::Check(const std::string& mesh, const std::string& name,
                                                const TensorDesc& desc, int64_t device) const {
  RETURN_IF_ERROR(ValidateName(name, "name"));
  RETURN_IF_ERROR(ValidateName(mesh, "mesh"));
  ASSIGN_OR_RETURN(MeshPlacement placement, resolver_(mesh));
  if (!placement.Owns(device)) {
    return InvalidArgument(
        "device " + std::to_string(device) + " of mesh '" + mesh +
            "' is not on this worker, which owns devices " + ShapeToString(placement.devices),
        {{"field", "device"}, {"device", device}, {"devices", placement.devices}});
  }
  RETURN_IF_ERROR(CheckShapeSize(desc.shape, "shape"));
  RETURN_IF_ERROR(ValidateLayout(placement.mesh, desc.layout, desc.shape));
  Checked c;
  c.local_shape = LocalShape(placement.mesh, desc.layout, desc.shape);
  c.bytes = static_cast<size_t>(NumElements(c.local_shape)) * DTypeSize(desc.dtype);
  return c;
}

Status TensorStore::Mismatch(Code code, const Key& key, const TensorDesc& have,
                             const TensorDesc& want) {
  std::string message = "tensor '" + key.second + "' of mesh '" + key.first + "' is " +
                        have.ToString() + ", not " + want.ToString();
  message += code == Code::kConflict ? "; DELETE it first to change it"
                                     : "; a restore writes into it only when all three match";
  return Status(code, std::move(message),
                {{"tensor", key.second},
                 {"mesh", key.first},
                 {"existing", TensorDescToJson(have)},
                 {"requested", TensorDescToJson(want)}});
}

std::string TensorStore::ShmFileName(const std::string& name, int64_t device) {
  std::string safe = name.substr(0, kFileNameTensorChars);
  std::replace(safe.begin(), safe.end(), '/', '_');
  return options_.shm_prefix + "-" + std::to_string(next_file_++) + "-d" + std::to_string(device) +
         "-" + safe;
}

bool SameAsBase(const uint8_t* src, const uint8_t* base, size_t n, const uint64_t* expected, bool* equal) {
  if (expected == nullptr) return GuardedEqual(src, base, n, equal);
  // A shard that changed differs in its first block in practice: then no more is read.
  const size_t head = std::min(n, kCompareHead);
  if (!GuardedEqual(src, base, head, equal)) return false;
  if (!*equal || head == n) return true;
  uint64_t sum = 0;
  if (!GuardedChecksum(src, n, &sum)) return false;
  *equal = sum == *expected;
  return true;
}

bool TensorStore::CopyRun::Copy() const {
  if (bytes == 0) return true;  // src may be null when empty
  if (base == nullptr) return GuardedCopy(dst, src, bytes);
  bool equal = true;
  if (!SameAsBase(src, base, bytes, expected, &equal)) return false;
  if (!equal) differs->store(true, std::memory_order_relaxed);
  return true;
}

Status TensorStore::CopyParallel(const std::vector<CopyRun>& runs) {
  size_t total = 0;
  for (const auto& r : runs) total += r.bytes;
  const size_t threads = copy_pool_ ? static_cast<size_t>(copy_pool_->size()) + 1 : 1;
  // Whether a run faulted (its mapping truncated under it), and which mapping.
  std::atomic<bool> faulted{false};
  std::atomic<const ShardBuffer*> culprit{nullptr};
  auto copy_span = [&](const std::vector<CopyRun>& s) {
    for (const CopyRun& r : s) {
      if (r.Copy()) continue;
      if (!faulted.exchange(true)) culprit = r.mapping;
    }
  };
  if (threads == 1 || total < kParallelCopyMin) {
    copy_span(runs);
  } else {
    // Cut the runs into `threads` spans of equal bytes; big buffers are split.
    const size_t part = (total + threads - 1) / threads;
    std::vector<std::vector<CopyRun>> spans(threads);
    size_t span = 0;
    size_t filled = 0;
    for (const auto& r : runs) {
      if (r.expected != nullptr) {  // one checksum over the whole run
        spans[span].push_back(r);
        filled += r.bytes;
        if (filled >= part && span + 1 < threads) ++span, filled = 0;
        continue;
      }
      for (size_t off = 0; off < r.bytes;) {
        const size_t room = span + 1 == threads ? std::numeric_limits<size_t>::max() : part - filled;
        const size_t take = std::min(r.bytes - off, room);
        spans[span].push_back({r.src + off, r.dst != nullptr ? r.dst + off : nullptr, take, r.mapping,
                               r.base != nullptr ? r.base + off : nullptr, r.differs});
        off += take;
        filled += take;
        if (filled == part && span + 1 < threads) {
          ++span;
          filled = 0;
        }
      }
    }
    std::vector<std::future<void>> done;
    for (size_t i = 1; i < threads; ++i) {
      done.push_back(copy_pool_->Submit([&copy_span, &s = spans[i]] { copy_span(s); }));
    }
    copy_span(spans[0]);
    for (auto& f : done) f.get();
  }
  return faulted.load() ? Shrank(culprit.load()) : Status::Ok();
}

Status TensorStore::Shrank(const ShardBuffer* mapping) {
  const std::string file = mapping != nullptr ? mapping->path() : std::string("a shared-memory file");
  return Conflict(file + " shrank while the worker copied it (truncated by its trainer?): a mapped shard must keep "
                  "its size",
                  {{"file", file}});
}

Status TensorStore::CopyChecked(const CopyRun& run, uint64_t* checksum) {
  if (checksum == nullptr) return CopyParallel({run});
  // One thread, one pass: the checksum is of the bytes as they landed.
  return GuardedCopy(run.dst, run.src, run.bytes, checksum) ? Status::Ok() : Shrank(run.mapping);
}

Status TensorStore::Write(const std::string& mesh, const std::string& name, const TensorDesc& desc,
                          int64_t device, const void* data, size_t n, Code mismatch, uint64_t* checksum) {
  ASSIGN_OR_RETURN(Checked checked, Check(mesh, name, desc, device));
  if (n != checked.bytes) {
    return InvalidArgument("body has " + std::to_string(n) + " bytes but " + desc.ToString() +
                               " has " + std::to_string(checked.bytes) +
                               " bytes per device (local shape [" +
                               ShapeToString(checked.local_shape) + "])",
                           {{"field", "body"}, {"bytes", n}, {"expected_bytes", checked.bytes}});
  }
  const auto* src = static_cast<const uint8_t*>(data);
  const Key key{mesh, name};
  std::shared_ptr<ShardBuffer> fresh;  // filled outside the lock, then swapped in
  while (true) {
    std::shared_ptr<ShardBuffer> mapped;
    std::shared_ptr<ShardBuffer> replaced;  // released after the lock
    std::shared_ptr<const BorrowedMemory> lent;
    {
      MutexLock lock(mu_);
      auto it = tensors_.find(key);
      if (it != tensors_.end()) {
        if (it->second.desc != desc) return Mismatch(mismatch, key, it->second.desc, desc);
        auto shard = it->second.shards.find(device);
        if (shard != it->second.shards.end() && shard->second->mapped()) mapped = shard->second;
        if (auto b = it->second.borrowed.find(device); b != it->second.borrowed.end()) {
          lent = b->second;
        }
      }
      // A borrowed shard is the trainer's memory, written in place outside the lock.
      if (lent == nullptr && mapped == nullptr && fresh != nullptr) {
        if (it == tensors_.end()) {
          it = tensors_.emplace(key, Entry{desc, checked.local_shape, {}}).first;
        }
        replaced = std::exchange(it->second.shards[device], std::move(fresh));
        return Status::Ok();
      }
    }
    if (lent != nullptr) {
      // Held across the write so that EndLoans waits for it; the loan checked again
      // under it, since EndLoans may have ended it since.
      std::shared_lock<std::shared_mutex> writing(bytes_mu_);
      bool still = false;
      {
        MutexLock lock(mu_);
        auto it = tensors_.find(key);
        if (it != tensors_.end()) {
          auto b = it->second.borrowed.find(device);
          still = b != it->second.borrowed.end() && b->second == lent;
        }
      }
      if (still) {
        if (checksum != nullptr) *checksum = Checksum64(src, n);  // the trainer's own memory is written by the kernel
        return lent->Write(0, src, n);
      }
      continue;  // the loan ended: an ordinary shard now
    }
    if (mapped != nullptr) {
      // The trainer's memory: written in place so that its view stays valid.
      std::unique_lock<std::shared_mutex> writing(bytes_mu_);
      return CopyChecked({src, mapped->data(), n, mapped.get()}, checksum);
    }
    ASSIGN_OR_RETURN(fresh, ShardBuffer::Heap(n));
    RETURN_IF_ERROR(CopyChecked({src, fresh->data(), n}, checksum));
    // Loop: the shard may have become a mapping meanwhile, which must not be replaced.
  }
}

Status TensorStore::Put(const std::string& mesh, const std::string& name, const TensorDesc& desc,
                        int64_t device, std::string_view bytes) {
  return Write(mesh, name, desc, device, bytes.data(), bytes.size(), Code::kConflict);
}

Status TensorStore::Install(const std::string& mesh, const std::string& name, const TensorDesc& desc,
                            int64_t device, const void* data, size_t n, uint64_t* checksum) {
  return Write(mesh, name, desc, device, data, n, Code::kInvalidArgument, checksum);
}

Status TensorStore::ReserveLike(const Snapshot& like) {
  for (const auto& t : like.tensors) {
    for (const auto& s : t.shards) {
      if (s.size() > 0) RETURN_IF_ERROR(pool_->Reserve(s.size()));
    }
  }
  return Status::Ok();
}

Status TensorStore::Borrow(const std::string& mesh, const std::string& name,
                           const TensorDesc& desc, int64_t device,
                           std::shared_ptr<const BorrowedMemory> memory) {
  ASSIGN_OR_RETURN(Checked checked, Check(mesh, name, desc, device));
  if (memory->size() != checked.bytes) {
    return InvalidArgument("tensor '" + name + "' " + desc.ToString() + " has " +
                               std::to_string(checked.bytes) + " bytes on device " +
                               std::to_string(device) + ", not the " +
                               std::to_string(memory->size()) + " lent",
                           {{"field", "bytes"}, {"tensor", name}, {"device", device}});
  }
  const Key key{mesh, name};
  std::shared_ptr<ShardBuffer> dropped;  // released after the lock
  MutexLock lock(mu_);
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    it = tensors_.emplace(key, Entry{desc, checked.local_shape, {}}).first;
  } else if (it->second.desc != desc) {
    return Mismatch(Code::kConflict, key, it->second.desc, desc);
  }
  if (auto shard = it->second.shards.find(device); shard != it->second.shards.end()) {
    dropped = std::move(shard->second);
    it->second.shards.erase(shard);
  }
  it->second.borrowed[device] = std::move(memory);
  return Status::Ok();
}

void TensorStore::EndLoans(const std::string& mesh, const std::vector<std::string>& names) {
  if (names.empty()) return;
  for (const std::string& name : names) (void)Delete(mesh, name);
  std::unique_lock<std::shared_mutex> drained(bytes_mu_);  // writes that passed their check
}

Result<ShardMapping> TensorStore::Map(const std::string& mesh, const std::string& name,
                                      const TensorDesc& desc, int64_t device) {
  ASSIGN_OR_RETURN(Checked checked, Check(mesh, name, desc, device));
  const Key key{mesh, name};
  std::shared_ptr<ShardBuffer> fresh;        // the new mapping
  std::shared_ptr<ShardBuffer> copied_from;  // the heap shard whose bytes `fresh` holds
  while (true) {
    std::shared_ptr<ShardBuffer> current;
    std::string file_name;
    {
      MutexLock lock(mu_);
      auto it = tensors_.find(key);
      if (it != tensors_.end()) {
        if (it->second.desc != desc) return Mismatch(Code::kConflict, key, it->second.desc, desc);
        auto shard = it->second.shards.find(device);
        if (shard != it->second.shards.end()) current = shard->second;
      }
      if (current != nullptr && current->mapped()) {
        return ShardMapping{current->path(), current->size(), checked.local_shape};
      }
      if (fresh != nullptr && current == copied_from) {
        if (it == tensors_.end()) {
          it = tensors_.emplace(key, Entry{desc, checked.local_shape, {}}).first;
        }
        it->second.shards[device] = fresh;
        return ShardMapping{fresh->path(), fresh->size(), checked.local_shape};
      }
      if (fresh == nullptr) file_name = ShmFileName(name, device);
    }
    if (fresh == nullptr) {
      ASSIGN_OR_RETURN(fresh, ShardBuffer::Shm(options_.shm_dir, file_name, checked.bytes));
      // Its snapshot buffer, faulted in now: the first save stalls like the others.
      RETURN_IF_ERROR(pool_->Reserve(checked.bytes));
    }
    // A Put may have replaced the heap shard while we copied: copy again until it holds still.
    if (current != nullptr) {
      RETURN_IF_ERROR(CopyParallel({{current->data(), fresh->data(), checked.bytes, fresh.get()}}));
    } else if (copied_from != nullptr) {
      std::memset(fresh->data(), 0, checked.bytes);  // the shard was deleted meanwhile
    }
    copied_from = current;
  }
}

std::shared_ptr<ShardBuffer> TensorStore::MappedShard(const std::string& mesh, const std::string& name,
                                                     const TensorDesc& desc, int64_t device) const {
  MutexLock lock(mu_);
  auto it = tensors_.find(Key{mesh, name});
  if (it == tensors_.end() || it->second.desc != desc) return nullptr;
  auto shard = it->second.shards.find(device);
  if (shard == it->second.shards.end() || !shard->second->mapped()) return nullptr;
  return shard->second;
}

Result<ShardRef> TensorStore::Get(const std::string& mesh, const std::string& name,
                                  int64_t device) const {
  MutexLock lock(mu_);
  auto it = tensors_.find(Key{mesh, name});
  if (it == tensors_.end()) {
    return NotFound("no tensor '" + name + "' in mesh '" + mesh + "' on this worker",
                    {{"tensor", name}, {"mesh", mesh}});
  }
  if (it->second.borrowed.count(device)) {
    return Conflict("tensor '" + name + "' of mesh '" + mesh + "' on device " + std::to_string(device) +
                        " is the trainer's own memory, lent for a restore; ask the trainer",
                    {{"tensor", name}, {"mesh", mesh}, {"device", device}});
  }
  auto shard = it->second.shards.find(device);
  if (shard == it->second.shards.end()) {
    return NotFound("tensor '" + name + "' of mesh '" + mesh + "' has no shard for device " +
                        std::to_string(device) + " on this worker",
                    {{"tensor", name}, {"mesh", mesh}, {"device", device}});
  }
  return ShardRef{it->second.desc, it->second.local_shape, shard->second};
}

Result<ShardRef> TensorStore::Read(const std::string& mesh, const std::string& name, int64_t device,
                                   std::string* bytes) const {
  ASSIGN_OR_RETURN(ShardRef ref, Get(mesh, name, device));
  std::shared_lock<std::shared_mutex> reading(bytes_mu_);
  bytes->assign(reinterpret_cast<const char*>(ref.buffer->data()), ref.buffer->size());
  return ref;
}

std::vector<TensorInfo> TensorStore::List() const {
  MutexLock lock(mu_);
  std::vector<TensorInfo> out;
  out.reserve(tensors_.size());
  for (const auto& [key, entry] : tensors_) {
    TensorInfo info{key.first, key.second, entry.desc, {}, false};
    for (const auto& [device, buffer] : entry.shards) {
      info.devices.push_back(device);
      info.mapped = info.mapped || buffer->mapped();
    }
    for (const auto& [device, memory] : entry.borrowed) info.devices.push_back(device);
    std::sort(info.devices.begin(), info.devices.end());
    out.push_back(std::move(info));
  }
  return out;
}

Status TensorStore::Delete(const std::string& mesh, const std::string& name) {
  Entry dropped;  // unmapped and unlinked after the lock is released
  MutexLock lock(mu_);
  auto it = tensors_.find(Key{mesh, name});
  if (it == tensors_.end()) {
    return NotFound("no tensor '" + name + "' in mesh '" + mesh + "' on this worker",
                    {{"tensor", name}, {"mesh", mesh}});
  }
  dropped = std::move(it->second);
  tensors_.erase(it);
  return Status::Ok();
}

Result<std::shared_ptr<const Snapshot>> TensorStore::TakeSnapshot(
    const std::string& mesh, const std::optional<std::vector<std::string>>& names) {
  ASSIGN_OR_RETURN(MeshPlacement placement, resolver_(mesh));
  return TakeSnapshot(placement, names);
}

Result<std::shared_ptr<const Snapshot>> TensorStore::TakeSnapshot(
    const MeshPlacement& placement, const std::optional<std::vector<std::string>>& names,
    const Snapshot* base, const ShardChecksums* base_sums) {
  const std::string& mesh = placement.mesh.name;
  auto snapshot = std::make_shared<Snapshot>();
  // Per tensor, (index in its shards, the buffer to copy); borrowed shards are not copied.
  std::vector<std::vector<std::pair<size_t, std::shared_ptr<const ShardBuffer>>>> sources;
  {
    MutexLock lock(mu_);
    auto take = [&](const std::string& name, const Entry& entry) {
      Snapshot::Tensor t{name, entry.desc, {}, {}};
      auto& src = sources.emplace_back();
      for (int64_t device : placement.devices) {
        auto shard = entry.shards.find(device);
        if (auto lent = entry.borrowed.find(device); lent != entry.borrowed.end()) {
          t.shards.push_back({device, nullptr, lent->second});
        } else if (shard == entry.shards.end()) {
          t.absent_devices.push_back(device);
        } else {
          src.emplace_back(t.shards.size(), shard->second);
          t.shards.push_back({device, nullptr});
        }
      }
      snapshot->tensors.push_back(std::move(t));
    };
    if (names.has_value()) {
      for (const std::string& name : std::set<std::string>(names->begin(), names->end())) {
        auto it = tensors_.find(Key{mesh, name});
        if (it == tensors_.end()) {
          return NotFound("cannot snapshot tensor '" + name + "' of mesh '" + mesh +
                              "': this worker does not hold it",
                          {{"tensor", name}, {"mesh", mesh}});
        }
        take(name, it->second);
      }
    } else {
      for (auto it = tensors_.lower_bound(Key{mesh, ""});
           it != tensors_.end() && it->first.first == mesh; ++it) {
        take(it->first.second, it->second);
      }
    }
  }
  // First the shards that may equal base's: compared (in parallel, each stopping at
  // its first difference); those that do share base's buffer. Then the copies.
  std::deque<std::atomic<bool>> differs;  // by shard, in order (stable addresses)
  std::vector<const Snapshot::Shard*> bases;  // by shard, in order: base's shard, or null
  std::vector<CopyRun> compares;
  for (size_t i = 0; i < sources.size(); ++i) {
    const Snapshot::Tensor& t = snapshot->tensors[i];
    for (const auto& [j, buffer] : sources[i]) {
      const Snapshot::Shard* b = Snapshot::BaseShard(base, t, {t.shards[j].device, buffer});
      std::atomic<bool>& flag = differs.emplace_back(false);
      bases.push_back(b);
      if (b != nullptr) {
        compares.push_back({buffer->data(), nullptr, buffer->size(), buffer->mapped() ? buffer.get() : nullptr,
                            b->buffer->data(), &flag, ChecksumOf(base_sums, t.name, b->device)});
      }
    }
  }
  std::shared_lock<std::shared_mutex> reading(bytes_mu_);
  if (!compares.empty()) RETURN_IF_ERROR(CopyParallel(compares));
  std::vector<CopyRun> runs;
  for (size_t i = 0, f = 0; i < sources.size(); ++i) {
    for (const auto& [j, buffer] : sources[i]) {
      const Snapshot::Shard* b = bases[f];
      const bool same = b != nullptr && !differs[f].load();
      ++f;
      if (same) {
        snapshot->tensors[i].shards[j].buffer = b->buffer;
        continue;
      }
      const ShardBuffer& src = *buffer;
      ASSIGN_OR_RETURN(std::shared_ptr<ShardBuffer> dst, pool_->Acquire(src.size()));
      // A mapping is read through the worker's own, populated view (ShardBuffer::Shm).
      runs.push_back({src.data(), dst->data(), src.size(), src.mapped() ? &src : nullptr});
      snapshot->tensors[i].shards[j].buffer = std::move(dst);
    }
  }
  RETURN_IF_ERROR(CopyParallel(runs));
  reading.unlock();
  snapshot->placement = std::move(placement);
  return std::shared_ptr<const Snapshot>(std::move(snapshot));
}

}  // namespace tessera::worker
