#include "service/checkpoint_registry.h"

#include <algorithm>

#include "api/names.h"

namespace tessera::service {

void CheckpointRegistry::Load(CheckpointRecord c) {
  MutexLock lock(mu_);
  const std::string key = c.key();
  checkpoints_[key].record = std::move(c);
}

std::optional<CheckpointRecord> CheckpointRegistry::Get(const std::string& key) const {
  MutexLock lock(mu_);
  auto it = checkpoints_.find(key);
  if (it == checkpoints_.end()) return std::nullopt;
  return it->second.record;
}

Status CheckpointRegistry::Reserve(const CheckpointRecord& pending) {
  MutexLock lock(mu_);
  auto [it, inserted] = checkpoints_.try_emplace(pending.key());
  Entry& e = it->second;
  if (!inserted) {
    const CheckpointRecord& c = e.record;
    const std::string what = "step " + std::to_string(c.step) + " of mesh " + c.mesh + " is ";
    const Json details = {{"mesh", c.mesh}, {"step", c.step}, {"state", c.state}, {"job", c.job}};
    if (e.deleting) return Conflict(what + "being deleted", details);
    if (c.state == CheckpointState::kCommitted) return Conflict(what + "already committed", details);
    if (c.state != CheckpointState::kFailed) {
      return Conflict(what + "already being saved by job " + c.job, details);
    }
  }
  // A failed save's job may still be ending: it releases its own hold, not this one.
  e.record = pending;
  e.holders = {pending.job};
  return Status::Ok();
}

void CheckpointRegistry::Erase(const std::string& key) {
  MutexLock lock(mu_);
  checkpoints_.erase(key);
}

std::optional<CheckpointRecord> CheckpointRegistry::Update(
    const std::string& key, const std::function<void(CheckpointRecord&)>& change) {
  MutexLock lock(mu_);
  auto it = checkpoints_.find(key);
  if (it == checkpoints_.end()) return std::nullopt;
  change(it->second.record);
  return it->second.record;
}

Result<const CheckpointRegistry::Entry*> CheckpointRegistry::FindCommittedLocked(
    const std::string& mesh, const std::string& step) const {
  if (step == "latest") {
    const Entry* best = nullptr;
    for (const auto& [k, e] : checkpoints_) {
      const CheckpointRecord& c = e.record;
      if (c.mesh == mesh && c.state == CheckpointState::kCommitted && !e.deleting &&
          (!best || c.step > best->record.step)) {
        best = &e;
      }
    }
    if (!best) return NotFound("mesh " + mesh + " has no committed checkpoint", {{"mesh", mesh}});
    return best;
  }
  ASSIGN_OR_RETURN(int64_t s, ParseStep(step));
  auto it = checkpoints_.find(CheckpointRecord::Key(mesh, s));
  if (it == checkpoints_.end()) {
    return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(s),
                    {{"mesh", mesh}, {"step", s}});
  }
  const CheckpointRecord& c = it->second.record;
  if (c.state != CheckpointState::kCommitted || it->second.deleting) {
    const std::string state = it->second.deleting ? "being deleted" : StateString(c.state);
    return Conflict("checkpoint " + mesh + " step " + std::to_string(s) + " is " + state +
                        ", not committed",
                    {{"mesh", mesh}, {"step", s}, {"state", c.state}});
  }
  return &it->second;
}

Result<CheckpointRecord> CheckpointRegistry::FindCommitted(const std::string& mesh,
                                                           const std::string& step) const {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(const Entry* e, FindCommittedLocked(mesh, step));
  return e->record;
}

Result<CheckpointRecord> CheckpointRegistry::Hold(const std::string& mesh, const std::string& step,
                                                  const std::string& job) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(const Entry* e, FindCommittedLocked(mesh, step));
  checkpoints_.at(e->record.key()).holders.insert(job);
  return e->record;
}

void CheckpointRegistry::Release(const std::string& key, const std::string& job) {
  MutexLock lock(mu_);
  auto it = checkpoints_.find(key);
  if (it == checkpoints_.end()) return;
  auto h = it->second.holders.find(job);
  if (h != it->second.holders.end()) it->second.holders.erase(h);
}

Status CheckpointRegistry::HoldBase(const std::string& mesh, int64_t step, const std::string& job) {
  MutexLock lock(mu_);
  auto e = FindCommittedLocked(mesh, std::to_string(step));
  if (!e.ok()) return e.status();
  auto& holders = checkpoints_.at((*e)->record.key()).holders;
  if (!holders.count(job)) holders.insert(job);
  return Status::Ok();
}

void CheckpointRegistry::ReleaseBases(const std::string& mesh, int64_t step, const std::string& job) {
  MutexLock lock(mu_);
  for (auto& [key, e] : checkpoints_) {
    if (e.record.mesh != mesh || e.record.step == step) continue;
    auto h = e.holders.find(job);
    if (h != e.holders.end()) e.holders.erase(h);
  }
}

Result<CheckpointRecord> CheckpointRegistry::BeginDelete(const std::string& mesh, int64_t step) {
  MutexLock lock(mu_);
  auto it = checkpoints_.find(CheckpointRecord::Key(mesh, step));
  if (it == checkpoints_.end() || it->second.deleting) {
    return NotFound("mesh " + mesh + " has no checkpoint at step " + std::to_string(step),
                    {{"mesh", mesh}, {"step", step}});
  }
  Entry& e = it->second;
  if (e.record.state != CheckpointState::kCommitted && e.record.state != CheckpointState::kFailed) {
    return Conflict("checkpoint is being saved by job " + e.record.job, {{"job", e.record.job}});
  }
  if (!e.holders.empty()) {
    const std::string& job = *e.holders.begin();
    return Conflict("job " + job + " is using this checkpoint", {{"job", job}});
  }
  e.deleting = true;
  return e.record;
}

void CheckpointRegistry::EndDelete(const std::string& key, bool deleted) {
  MutexLock lock(mu_);
  auto it = checkpoints_.find(key);
  if (it == checkpoints_.end()) return;
  if (deleted) {
    checkpoints_.erase(it);
  } else {
    it->second.deleting = false;
  }
}

std::vector<Json> CheckpointRegistry::Summaries(const std::string& mesh) const {
  MutexLock lock(mu_);
  std::vector<const CheckpointRecord*> list;
  for (const auto& [k, e] : checkpoints_) {
    if (e.record.mesh == mesh) list.push_back(&e.record);
  }
  std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->step > b->step; });
  std::vector<Json> out;
  out.reserve(list.size());
  for (const CheckpointRecord* c : list) out.push_back(c->Summary());
  return out;
}

std::vector<int64_t> CheckpointRegistry::CommittedSteps(const std::string& mesh) const {
  MutexLock lock(mu_);
  std::vector<int64_t> steps;
  for (const auto& [k, e] : checkpoints_) {
    if (e.record.mesh == mesh && e.record.state == CheckpointState::kCommitted) {
      steps.push_back(e.record.step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

CheckpointRegistry::Totals CheckpointRegistry::Total() const {
  MutexLock lock(mu_);
  Totals t;
  for (const auto& [k, e] : checkpoints_) {
    if (e.record.state != CheckpointState::kCommitted) continue;
    ++t.committed;
    t.stored_bytes += e.record.stored_bytes;
    t.logical_bytes += e.record.logical_bytes;
  }
  return t;
}

}  // namespace tessera::service
