#include "worker/save_bases.h"

#include "storage/chunk_ref.h"

namespace tessera::worker {

std::string SliceKey(const TensorMeta& tensor, const SliceSpec& slice) {
  return tensor.name + "\n" + tensor.ToString() + "\n" + slice.ToString();
}

const std::vector<storage::SliceChunk>* SaveBase::Find(const TensorMeta& tensor,
                                                       const SliceSpec& slice) const {
  auto it = slices.find(SliceKey(tensor, slice));
  return it == slices.end() ? nullptr : &it->second;
}

std::shared_ptr<const SaveBase> SaveBases::For(const std::string& mesh, const SaveRequest& request) {
  if (request.full || request.full_every <= 1) return nullptr;
  MutexLock lock(mu_);
  auto it = bases_.find(mesh);
  if (it == bases_.end() || it->second.base->depth + 1 >= request.full_every) return nullptr;
  // Reported from now until the save's end: retention keeps the base meanwhile.
  building_[{mesh, request.step}] = it->second.base->step;
  return it->second.base;
}

void SaveBases::Wrote(const std::string& mesh, int64_t step, const std::string& dir,
                      const std::vector<storage::FragmentSlice>& fragment, const SaveBase* base) {
  auto wrote = std::make_shared<SaveBase>();
  wrote->step = step;
  wrote->depth = base == nullptr ? 0 : base->depth + 1;
  for (const storage::FragmentSlice& s : fragment) {
    std::vector<storage::SliceChunk>& chunks = wrote->slices[SliceKey(s.tensor, s.slice)];
    chunks = s.chunks;
    for (storage::SliceChunk& c : chunks) {
      if (c.file.empty()) c.file = storage::ChunkRef{dir, s.file}.ToString();
    }
  }
  MutexLock lock(mu_);
  pending_[{mesh, step}] = {++seq_, std::move(wrote)};
}

void SaveBases::Ended(const std::string& mesh, int64_t step, bool committed) {
  MutexLock lock(mu_);
  building_.erase({mesh, step});
  std::deque<int64_t>& ended = ended_[mesh];
  ended.push_back(step);
  if (ended.size() > kEndedReported) ended.pop_front();
  auto it = pending_.find({mesh, step});
  if (!committed) {
    // It may have failed for its base (deleted meanwhile): the next save writes every chunk.
    bases_.erase(mesh);
    if (it != pending_.end()) pending_.erase(it);
    return;
  }
  if (it == pending_.end()) return;
  Written done = std::move(it->second);
  pending_.erase(it);
  auto& current = bases_[mesh];
  if (!current.base || current.seq < done.seq) current = std::move(done);
  // What was written before the new base can no longer become one.
  for (auto p = pending_.begin(); p != pending_.end();) {
    p = p->first.first == mesh && p->second.seq < current.seq ? pending_.erase(p) : std::next(p);
  }
}

int64_t SaveBases::BaseStep(const std::string& mesh) {
  MutexLock lock(mu_);
  auto it = bases_.find(mesh);
  return it == bases_.end() ? -1 : it->second.base->step;
}

Json SaveBases::Report() {
  Json out = Json::object();
  MutexLock lock(mu_);
  auto of = [&](const std::string& mesh) -> Json& {
    Json& m = out[mesh];
    if (m.is_null()) m = {{"base", -1}, {"ended", Json::array()}, {"saves", Json::array()}};
    return m;
  };
  for (const auto& [mesh, written] : bases_) of(mesh)["base"] = written.base->step;
  for (const auto& [mesh, steps] : ended_) of(mesh)["ended"] = steps;
  for (const auto& [key, base] : building_) of(key.first)["saves"].push_back({key.second, base});
  return out;
}

}  // namespace tessera::worker
