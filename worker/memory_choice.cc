#include "worker/memory_choice.h"

#include <algorithm>
#include <map>
#include <set>

namespace tessera::worker {
namespace {

constexpr size_t kSlots = static_cast<size_t>(MemoryPolicy::kMaxKeep) + 1;
constexpr size_t kSlotWidth = 5 + kMaxRanks;  // step, own, redundancy, mode, count, ranks
constexpr size_t kHead = 6;  // lookup_failed, persisted, mesh, slots used, requested, timeline

std::string Who(const std::vector<std::string>& workers, int64_t rank) {
  const std::string id = rank >= 0 && rank < static_cast<int64_t>(workers.size()) ? workers[rank] : "";
  return "rank " + std::to_string(rank) + (id.empty() ? "" : " (" + id + ")");
}

const HeldStep* Find(const Inventory& inv, int64_t step) {
  for (const HeldStep& h : inv.steps) {
    if (h.step == step) return &h;
  }
  return nullptr;
}

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Whether every rank can have its share of `step`: fills `choice` (plan, sources),
// or says why not in *why.
bool Complete(const std::vector<Inventory>& inv, int64_t step, const std::vector<std::string>& workers,
              RestoreChoice* choice, std::string* why, int64_t* culprit) {
  const int n = static_cast<int>(inv.size());
  std::vector<ShareTransfer> plan;
  std::vector<std::string> sources(n);
  std::set<std::vector<int>> groups_rebuilt;
  for (int r = 0; r < n; ++r) {
    const HeldStep* mine = Find(inv[r], step);
    if (mine != nullptr && mine->own) {
      sources[r] = "local";
      continue;
    }
    // A copy, from the lowest rank that holds one.
    int holder = -1;
    std::vector<int> group;
    int parity = 1;
    for (int j = 0; j < n && holder < 0; ++j) {
      const HeldStep* h = Find(inv[j], step);
      if (h == nullptr || j == r) continue;
      if (h->mode == MemoryPolicy::Mode::kReplica && Contains(h->ranks, r)) holder = j;
      if (h->mode == MemoryPolicy::Mode::kParity && Contains(h->ranks, r) && group.empty()) {
        group = h->ranks;
        parity = h->parity;
      }
    }
    if (holder >= 0) {
      plan.push_back({ShareTransfer::Kind::kCopy, r, holder, {}, {}, {}, 1});
      sources[r] = "replica";
      continue;
    }
    if (!group.empty()) {
      // The group's members that lack their share or parity: no more than it survives.
      // Those that lost their share get it rebuilt; those that hold it but not their
      // parity (or another group's) only take no part.
      std::vector<int> lost, unusable;
      std::vector<std::string> lacking;
      for (int i : group) {
        const HeldStep* h = Find(inv[i], step);
        if (h == nullptr || !h->own) {
          lost.push_back(i);
        } else if (!h->redundancy || h->ranks != group) {
          unusable.push_back(i);
        } else {
          continue;
        }
        if (i != r) lacking.push_back(Who(workers, i));
      }
      if (static_cast<int>(lost.size() + unusable.size()) <= parity) {
        sources[r] = "parity";
        if (groups_rebuilt.insert(group).second) {
          plan.push_back({ShareTransfer::Kind::kParity, r, -1, group, lost, unusable, parity});
        }
        continue;
      }
      std::string others;
      for (const std::string& w : lacking) others += (others.empty() ? "" : ", ") + w;
      *why = "memory checkpoint step " + std::to_string(step) + " cannot be rebuilt: " + Who(workers, r) +
             " lost its share, and its parity group (which survives " + std::to_string(parity) +
             " loss" + (parity == 1 ? "" : "es") + ") also lacks " + others;
      *culprit = r;
      return false;
    }
    *why = "memory checkpoint step " + std::to_string(step) + " cannot be rebuilt: " + Who(workers, r) +
           " lost its share and no other worker holds a copy of it";
    *culprit = r;
    return false;
  }
  choice->plan = std::move(plan);
  choice->sources = std::move(sources);
  return true;
}

}  // namespace

size_t InventoryRecordSize() { return kHead + kSlots * kSlotWidth; }

std::vector<int64_t> EncodeInventory(const Inventory& inv) {
  std::vector<int64_t> out(InventoryRecordSize(), 0);
  out[0] = inv.lookup_failed ? 1 : 0;
  out[1] = inv.persisted;
  out[2] = inv.mesh_fingerprint;
  out[4] = inv.requested;
  out[5] = inv.timeline;
  // The newest steps, when there are more than fit.
  const size_t skip = inv.steps.size() > kSlots ? inv.steps.size() - kSlots : 0;
  size_t slot = 0;
  for (size_t i = skip; i < inv.steps.size(); ++i, ++slot) {
    const HeldStep& h = inv.steps[i];
    int64_t* s = out.data() + kHead + slot * kSlotWidth;
    s[0] = h.step;
    s[1] = h.own;
    s[2] = h.redundancy;
    s[3] = h.mode == MemoryPolicy::Mode::kParity ? h.parity : 0;  // 0: replica
    const size_t count = std::min(h.ranks.size(), kMaxRanks);
    s[4] = static_cast<int64_t>(count);
    for (size_t k = 0; k < count; ++k) s[5 + k] = h.ranks[k];
  }
  out[3] = static_cast<int64_t>(slot);
  return out;
}

Inventory DecodeInventory(const int64_t* record) {
  Inventory inv;
  inv.lookup_failed = record[0] != 0;
  inv.persisted = record[1];
  inv.mesh_fingerprint = record[2];
  inv.requested = record[4];
  inv.timeline = record[5];
  const size_t used = static_cast<size_t>(std::clamp<int64_t>(record[3], 0, static_cast<int64_t>(kSlots)));
  for (size_t slot = 0; slot < used; ++slot) {
    const int64_t* s = record + kHead + slot * kSlotWidth;
    HeldStep h;
    h.step = s[0];
    h.own = s[1] != 0;
    h.redundancy = s[2] != 0;
    h.mode = s[3] > 0 ? MemoryPolicy::Mode::kParity : MemoryPolicy::Mode::kReplica;
    h.parity = static_cast<int>(std::clamp<int64_t>(s[3], 1, MemoryPolicy::kMaxParity));
    const size_t count = static_cast<size_t>(std::clamp<int64_t>(s[4], 0, static_cast<int64_t>(kMaxRanks)));
    for (size_t k = 0; k < count; ++k) h.ranks.push_back(static_cast<int>(s[5 + k]));
    inv.steps.push_back(std::move(h));
  }
  return inv;
}

RestoreChoice ChooseRestore(const std::vector<Inventory>& by_rank, int64_t mesh_fingerprint,
                            const std::vector<std::string>& workers, std::optional<int64_t> named) {
  RestoreChoice choice;
  int64_t persisted = by_rank.empty() ? -1 : by_rank[0].persisted;
  std::set<int64_t, std::greater<>> steps;
  std::vector<Inventory> usable = by_rank;
  for (size_t r = 0; r < usable.size(); ++r) {
    Inventory& inv = usable[r];
    if (inv.lookup_failed && choice.lookup_failed < 0) choice.lookup_failed = static_cast<int64_t>(r);
    persisted = std::min(persisted, inv.persisted);  // every worker saw it committed
    // Shares held for another definition of the mesh do not count.
    if (inv.mesh_fingerprint != mesh_fingerprint) inv.steps.clear();
    for (const HeldStep& h : inv.steps) {
      if (!named || h.step == *named) steps.insert(h.step);
    }
  }
  for (int64_t step : steps) {
    if (step < persisted) break;
    std::string why;
    int64_t culprit = -1;
    if (Complete(usable, step, workers, &choice, &why, &culprit)) {
      choice.step = step;
      choice.memory = true;
      return choice;
    }
    if (choice.fallback.empty()) {
      choice.fallback = why;
      choice.culprit = culprit;
    }
  }
  choice.step = persisted;
  choice.memory = false;
  return choice;
}

int64_t AgreedTimeline(const std::vector<Inventory>& by_rank) {
  int64_t t = 0;
  for (const Inventory& inv : by_rank) t = std::max(t, inv.timeline);
  return t;
}

int64_t DisagreeingRank(const std::vector<Inventory>& by_rank) {
  for (size_t r = 1; r < by_rank.size(); ++r) {
    if (by_rank[r].requested != by_rank[0].requested) return static_cast<int64_t>(r);
  }
  return -1;
}

}  // namespace tessera::worker
