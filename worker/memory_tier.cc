#include "worker/memory_tier.h"

#include <algorithm>
#include <utility>

namespace tessera::worker {

uint64_t MemoryCheckpoint::bytes() const {
  uint64_t n = own.size() + parity.size();
  for (const auto& [rank, copy] : copies) n += copy.bytes.size();
  return n;
}

void MemoryCheckpoint::Views(std::vector<const ShareBytes*>* out) const {
  out->push_back(&own);
  out->push_back(&parity);
  for (const auto& [rank, copy] : copies) out->push_back(&copy.bytes);
}

void MemoryTier::Begin(std::shared_ptr<MemoryCheckpoint> ck) {
  std::shared_ptr<const MemoryCheckpoint> replaced;  // freed outside the lock
  MutexLock lock(mu_);
  Entry& e = meshes_[ck->mesh][ck->step];
  replaced = std::move(e.ck);
  e.ck = std::move(ck);
  e.committed = false;
}

void MemoryTier::Abandon(Steps& steps, int64_t step, int64_t mesh_fingerprint,
                         std::vector<std::shared_ptr<const MemoryCheckpoint>>* freed) {
  for (auto e = steps.begin(); e != steps.end();) {
    const bool abandoned = e->second.committed &&
                           (e->first > step || e->second.ck->mesh_fingerprint != mesh_fingerprint);
    if (!abandoned) {
      ++e;
      continue;
    }
    freed->push_back(std::move(e->second.ck));
    e = steps.erase(e);
  }
}

bool MemoryTier::Commit(const std::string& mesh, int64_t step, int64_t now_ms) {
  std::vector<std::shared_ptr<const MemoryCheckpoint>> freed;  // released outside the lock
  MutexLock lock(mu_);
  auto m = meshes_.find(mesh);
  if (m == meshes_.end()) return false;
  auto it = m->second.find(step);
  if (it == m->second.end()) return false;
  const MemoryCheckpoint& ck = *it->second.ck;
  Abandon(m->second, step, ck.mesh_fingerprint, &freed);
  int64_t& timeline = timelines_[mesh];
  if (timeline == 0 || !freed.empty()) timeline = std::max(now_ms, timeline + 1);
  it->second.committed = true;
  it->second.order = ++commits_;
  // The timeline's newest commits stay; `step` is the newest of all.
  std::vector<std::pair<uint64_t, int64_t>> by_order;  // (order, step), newest first
  for (const auto& [s, e] : m->second) {
    if (e.committed) by_order.emplace_back(e.order, s);
  }
  std::sort(by_order.rbegin(), by_order.rend());
  const size_t keep = static_cast<size_t>(std::max<int64_t>(ck.policy.keep, 1));
  for (size_t i = keep; i < by_order.size(); ++i) {
    auto o = m->second.find(by_order[i].second);
    freed.push_back(std::move(o->second.ck));
    m->second.erase(o);
  }
  return true;
}

std::vector<int64_t> MemoryTier::Rollback(const std::string& mesh, int64_t step, int64_t mesh_fingerprint,
                                          std::optional<int64_t> timeline) {
  std::vector<std::shared_ptr<const MemoryCheckpoint>> freed;
  std::vector<int64_t> steps;
  MutexLock lock(mu_);
  if (timeline) timelines_[mesh] = *timeline;
  auto m = meshes_.find(mesh);
  if (m == meshes_.end()) return steps;
  Abandon(m->second, step, mesh_fingerprint, &freed);
  for (const auto& ck : freed) steps.push_back(ck->step);
  std::sort(steps.begin(), steps.end());
  return steps;
}

int64_t MemoryTier::Timeline(const std::string& mesh) const {
  MutexLock lock(mu_);
  auto it = timelines_.find(mesh);
  return it == timelines_.end() ? 0 : it->second;
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

std::shared_ptr<const MemoryCheckpoint> MemoryTier::Find(const std::string& mesh, int64_t step) const {
  MutexLock lock(mu_);
  auto m = meshes_.find(mesh);
  if (m == meshes_.end()) return nullptr;
  auto it = m->second.find(step);
  return it == m->second.end() ? nullptr : it->second.ck;
}

std::shared_ptr<const MemoryCheckpoint> MemoryTier::Newest(const std::string& mesh) const {
  MutexLock lock(mu_);
  auto m = meshes_.find(mesh);
  if (m == meshes_.end() || m->second.empty()) return nullptr;
  return m->second.rbegin()->second.ck;
}

uint64_t MemoryTier::Bytes(const std::string& mesh) const {
  std::vector<const ShareBytes*> views;
  MutexLock lock(mu_);
  for (const auto& [name, steps] : meshes_) {
    if (!mesh.empty() && name != mesh) continue;
    for (const auto& [step, e] : steps) e.ck->Views(&views);
  }
  return DistinctBytes(views);
}

Json MemoryTier::Summary() const {
  Json meshes = Json::object();
  std::vector<const ShareBytes*> all;
  MutexLock lock(mu_);
  for (const auto& [name, steps] : meshes_) {
    Json committed = Json::array();
    std::vector<const ShareBytes*> views;
    for (const auto& [step, e] : steps) {
      // One being taken is still written by its exchange: not read here.
      if (!e.committed) continue;
      committed.push_back(step);
      e.ck->Views(&views);
    }
    all.insert(all.end(), views.begin(), views.end());
    meshes[name] = {{"steps", committed}, {"bytes", DistinctBytes(views)}};
  }
  return {{"meshes", meshes}, {"bytes", DistinctBytes(all)}};
}

}  // namespace tessera::worker
