#include "service/memory_checkpoints.h"

#include "service/states.h"

namespace tessera::service {
namespace {

// A step only the memory tier holds, as the list shows it (`tensors`: their number) or as
// its record does (`tensors`: the list).
Json MemoryEntry(const std::string& mesh, const MemoryCheckpointReport& memory, int64_t step,
                 Json tensors) {
  Json entry = {{"mesh", mesh},
                {"step", step},
                {"state", CheckpointState::kCommitted},
                {"tiers", Tiers(true, false)},
                {"redundancy", memory.redundancy},
                {"bytes", memory.bytes},
                {"tensors", std::move(tensors)}};
  if (memory.redundancy == "replica") {
    entry["replicas"] = memory.replicas;
  } else {
    entry["group"] = memory.group;
    entry["parity"] = memory.parity;
  }
  return entry;
}

}  // namespace

std::optional<int64_t> MemoryCheckpoints::Put(const std::string& mesh,
                                              MemoryCheckpointReport report) {
  auto kept = std::make_shared<const MemoryCheckpointReport>(std::move(report));
  MutexLock lock(mu_);
  Report& held = reports_[mesh];
  if (held && std::make_pair(held->timeline, held->step) > std::make_pair(kept->timeline, kept->step)) {
    return held->step;
  }
  held = std::move(kept);
  return std::nullopt;
}

MemoryCheckpoints::Report MemoryCheckpoints::Get(const std::string& mesh) const {
  MutexLock lock(mu_);
  auto it = reports_.find(mesh);
  return it == reports_.end() ? nullptr : it->second;
}

void MemoryCheckpoints::Forget(const std::string& mesh) {
  MutexLock lock(mu_);
  reports_.erase(mesh);
}

std::map<std::string, uint64_t> MemoryCheckpoints::WorkerBytes() const {
  MutexLock lock(mu_);
  std::map<std::string, uint64_t> bytes;
  for (const auto& [mesh, report] : reports_) {
    for (const auto& w : report->workers) bytes[w.worker] += w.memory_bytes;
  }
  return bytes;
}

Json Tiers(bool memory, bool persisted) {
  Json tiers = Json::array();
  if (memory) tiers.push_back("memory");
  if (persisted) tiers.push_back("persisted");
  return tiers;
}

std::vector<Json> WithMemoryTier(const std::string& mesh, std::vector<Json> persisted,
                                 const MemoryCheckpointReport* memory) {
  static const std::vector<int64_t> kNone;
  const std::vector<int64_t>& steps = memory ? memory->steps : kNone;
  std::vector<Json> out;
  out.reserve(persisted.size() + steps.size());
  auto m = steps.rbegin();  // newest first, as the list
  auto memory_only = [&] {
    out.push_back(MemoryEntry(mesh, *memory, *m, memory->tensors.size()));
    ++m;
  };
  for (Json& entry : persisted) {
    const int64_t step = entry.value("step", int64_t{0});
    while (m != steps.rend() && *m > step) memory_only();
    const bool in_memory = m != steps.rend() && *m == step;
    if (in_memory) ++m;
    const bool committed =
        StateOr(entry, "state", CheckpointState::kFailed) == CheckpointState::kCommitted;
    entry["tiers"] = Tiers(in_memory, committed);
    out.push_back(std::move(entry));
  }
  while (m != steps.rend()) memory_only();
  return out;
}

Json MemoryCheckpointRecord(const std::string& mesh, const MemoryCheckpointReport& memory,
                            int64_t step) {
  return MemoryEntry(mesh, memory, step, memory.TensorsJson());
}

}  // namespace tessera::service
