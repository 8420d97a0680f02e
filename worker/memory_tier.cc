#include "worker/memory_tier.h"

#include <utility>

namespace tessera::worker {

uint64_t MemoryCheckpoint::bytes() const {
  uint64_t n = own.size() + parity.size();
  for (const auto& [rank, copy] : copies) n += copy.bytes.size();
  return n;
}

void MemoryTier::Begin(std::shared_ptr<MemoryCheckpoint> ck) {
  std::shared_ptr<const MemoryCheckpoint> replaced;  // freed outside the lock
  MutexLock lock(mu_);
  Entry& e = meshes_[ck->mesh][ck->step];
  replaced = std::move(e.ck);
  e.ck = std::move(ck);
  e.committed = false;
}

bool MemoryTier::Commit(const std::string& mesh, int64_t step) {
  std::vector<std::shared_ptr<const MemoryCheckpoint>> freed;  // outside the lock
  MutexLock lock(mu_);
  auto m = meshes_.find(mesh);
  if (m == meshes_.end()) return false;
  auto it = m->second.find(step);
  if (it == m->second.end()) return false;
  it->second.committed = true;
  const int64_t keep = it->second.ck->policy.keep;
  int64_t newer = 0;  // committed ones at or above each step, walking down
  std::vector<int64_t> old;
  for (auto e = m->second.rbegin(); e != m->second.rend(); ++e) {
    if (e->second.committed && ++newer > keep) old.push_back(e->first);
  }
  for (int64_t s : old) {
    auto o = m->second.find(s);
    freed.push_back(std::move(o->second.ck));
    m->second.erase(o);
  }
  return true;
}

void MemoryTier::Drop(const std::string& mesh, int64_t step) {
  std::shared_ptr<const MemoryCheckpoint> dropped;
  MutexLock lock(mu_);
  auto m = meshes_.find(mesh);
  if (m == meshes_.end()) return;
  auto it = m->second.find(step);
  if (it == m->second.end()) return;
  dropped = std::move(it->second.ck);
  m->second.erase(it);
}

std::vector<std::shared_ptr<const MemoryCheckpoint>> MemoryTier::Committed(const std::string& mesh) const {
  std::vector<std::shared_ptr<const MemoryCheckpoint>> out;
  MutexLock lock(mu_);
  auto m = meshes_.find(mesh);
  if (m == meshes_.end()) return out;
  for (const auto& [step, e] : m->second) {
    if (e.committed) out.push_back(e.ck);
  }
  return out;
}

uint64_t MemoryTier::Bytes(const std::string& mesh) const {
  uint64_t n = 0;
  MutexLock lock(mu_);
  for (const auto& [name, steps] : meshes_) {
    if (!mesh.empty() && name != mesh) continue;
    for (const auto& [step, e] : steps) n += e.ck->bytes();
  }
  return n;
}

Json MemoryTier::Summary() const {
  Json meshes = Json::object();
  uint64_t total = 0;
  MutexLock lock(mu_);
  for (const auto& [name, steps] : meshes_) {
    Json committed = Json::array();
    uint64_t bytes = 0;
    for (const auto& [step, e] : steps) {
      if (e.committed) committed.push_back(step);
      bytes += e.ck->bytes();
    }
    total += bytes;
    meshes[name] = {{"steps", committed}, {"bytes", bytes}};
  }
  return {{"meshes", meshes}, {"bytes", total}};
}

}  // namespace tessera::worker
