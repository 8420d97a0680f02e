#include "service/base_use.h"

#include <algorithm>

namespace tessera::service {
namespace {

constexpr size_t kMaxMeshes = 4096;
constexpr size_t kMaxSaves = 4096;
constexpr size_t kMaxEnded = 64;

Status Bad(const std::string& field, const std::string& why) {
  return InvalidArgument("bases: " + field + " " + why, {{"field", "bases" + field}});
}

}  // namespace

Result<BaseReport> BaseReportFromJson(const Json& j) {
  if (!j.is_object()) return Bad("", "must be an object of meshes");
  if (j.size() > kMaxMeshes) return Bad("", "names more than " + std::to_string(kMaxMeshes) + " meshes");
  BaseReport out;
  for (const auto& [mesh, m] : j.items()) {
    const std::string at = "." + mesh;
    if (!m.is_object()) return Bad(at, "must be an object");
    BaseReport::Mesh& mine = out.meshes[mesh];
    const Json base = m.value("base", Json(-1));
    if (!base.is_number_integer() || base.get<int64_t>() < -1) {
      return Bad(at + ".base", "must be a step (or -1)");
    }
    mine.base = base.get<int64_t>();
    const Json ended = m.value("ended", Json::array());
    if (!ended.is_array() || ended.size() > kMaxEnded) {
      return Bad(at + ".ended", "must be a list of at most " + std::to_string(kMaxEnded) + " steps");
    }
    for (size_t i = 0; i < ended.size(); ++i) {
      if (!ended[i].is_number_integer() || ended[i].get<int64_t>() < 0) {
        return Bad(at + ".ended[" + std::to_string(i) + "]", "must be a step");
      }
      mine.ended.push_back(ended[i].get<int64_t>());
    }
    const Json saves = m.value("saves", Json::array());
    if (!saves.is_array() || saves.size() > kMaxSaves) {
      return Bad(at + ".saves", "must be a list of at most " + std::to_string(kMaxSaves) + " saves");
    }
    for (size_t i = 0; i < saves.size(); ++i) {
      const Json& s = saves[i];
      if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer() ||
          s[0].get<int64_t>() < 0 || s[1].get<int64_t>() < 0) {
        return Bad(at + ".saves[" + std::to_string(i) + "]", "must be [step, base step]");
      }
      mine.saves.emplace_back(s[0].get<int64_t>(), s[1].get<int64_t>());
    }
  }
  return out;
}

void BaseUse::Put(const std::string& worker, BaseReport report) {
  {
    MutexLock lock(mu_);
    workers_[worker] = std::move(report);
  }
  cv_.NotifyAll();
}

void BaseUse::Forget(const std::string& worker) {
  MutexLock lock(mu_);
  workers_.erase(worker);
}

bool BaseUse::WaitHeard(const std::vector<std::string>& workers, const std::string& mesh,
                        int64_t step, int64_t timeout_ms) {
  const int64_t deadline = clock_->MonoMs() + timeout_ms;
  MutexLock lock(mu_);
  while (true) {
    bool all = true;  // a loop, not a lambda: the lock's analysis sees mu_ held here
    for (const std::string& w : workers) {
      auto it = workers_.find(w);
      if (it == workers_.end()) continue;
      auto m = it->second.meshes.find(mesh);
      const std::vector<int64_t>* ended = m == it->second.meshes.end() ? nullptr : &m->second.ended;
      if (ended == nullptr || std::find(ended->begin(), ended->end(), step) == ended->end()) {
        all = false;
        break;
      }
    }
    if (all) return true;
    if (clock_->MonoMs() >= deadline) return false;
    clock_->WaitUntil(cv_, mu_, deadline);
  }
}

std::optional<int64_t> BaseUse::Floor(const std::vector<std::string>& workers, const std::string& mesh,
                                      const std::function<bool(int64_t step)>& open) {
  std::vector<std::pair<int64_t, int64_t>> saves;
  std::optional<int64_t> floor;
  auto lower = [&](int64_t step) { floor = floor ? std::min(*floor, step) : step; };
  {
    MutexLock lock(mu_);
    for (const std::string& w : workers) {
      auto it = workers_.find(w);
      if (it == workers_.end()) continue;
      auto m = it->second.meshes.find(mesh);
      if (m == it->second.meshes.end()) continue;
      if (m->second.base >= 0) lower(m->second.base);
      saves.insert(saves.end(), m->second.saves.begin(), m->second.saves.end());
    }
  }
  // `open` reads other registries: asked with no lock of this one held.
  for (const auto& [step, base] : saves) {
    if (open(step)) lower(base);
  }
  return floor;
}

}  // namespace tessera::service
