// Snapshot's lookups (worker/tensor_store.h): a snapshot's tensors, its size, and the
// shards it shares with the memory checkpoint before and their checksums.
#include <algorithm>

#include "worker/tensor_store.h"

namespace tessera::worker {

const Snapshot::Tensor* Snapshot::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const Tensor& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

uint64_t Snapshot::bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) {
    for (const auto& s : t.shards) n += s.size();
  }
  return n;
}

bool Snapshot::borrows() const {
  for (const auto& t : tensors) {
    for (const auto& s : t.shards) {
      if (s.borrowed) return true;
    }
  }
  return false;
}

const Snapshot::Shard* Snapshot::BaseShard(const Snapshot* base, const Tensor& t, const Shard& shard) {
  const Tensor* b = base != nullptr ? base->Find(t.name) : nullptr;
  if (b == nullptr || b->desc != t.desc) return nullptr;
  for (const Shard& s : b->shards) {
    if (s.device == shard.device) return s.buffer != nullptr && s.buffer->size() == shard.size() ? &s : nullptr;
  }
  return nullptr;
}

bool Snapshot::SharedWith(const Snapshot* base, const Tensor& t, const Shard& shard) {
  const Shard* b = BaseShard(base, t, shard);
  return b != nullptr && shard.buffer != nullptr && b->buffer == shard.buffer;
}

const uint64_t* ChecksumOf(const ShardChecksums* sums, const std::string& tensor, int64_t device) {
  if (sums == nullptr) return nullptr;
  auto it = sums->find({tensor, device});
  return it == sums->end() ? nullptr : &it->second;
}

}  // namespace tessera::worker
