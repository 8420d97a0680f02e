// Which step a restore takes (docs/memory-tier.md, "Restoring"): every worker brings
// what it holds (its inventory) and the step its trainer asked for, the inventories
// are gathered over the mesh's memory group, and each worker computes the same choice
// from them, so that every rank restores the same step or none does. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/memory_exchange.h"
#include "worker/memory_layout.h"

namespace tessera::worker {

struct HeldStep {
  int64_t step = 0;
  bool own = false;         // its own share, checked
  bool redundancy = false;  // parity: its parity, checked
  MemoryPolicy::Mode mode = MemoryPolicy::Mode::kReplica;
  int parity = 1;  // parity mode: the losses its group survives
  // Replica: the ranks whose copies it holds, checked. Parity: its group, in order.
  std::vector<int> ranks;
};

struct Inventory {
  int64_t requested = -1;      // the step its trainer asked for; -1: the latest
  bool lookup_failed = false;  // could not ask tesserad for the persisted step
  // Latest: the newest persisted step it saw committed. A named step: that step when
  // it saw it committed in the root, else -1.
  int64_t persisted = -1;
  int64_t mesh_fingerprint = 0;
  // The timeline it proposes the restore begins: later than its own (wall ms).
  int64_t timeline = 0;
  std::vector<HeldStep> steps;  // committed memory checkpoints, ascending
};

// The fixed-size record an inventory travels as (int64s), and back. Steps beyond the
// record's room (MemoryPolicy::kMaxKeep + 1) are left out. kMaxRanks holds the
// largest parity group: kMaxGroup, joined by a last group of one.
constexpr size_t kMaxRanks = static_cast<size_t>(MemoryPolicy::kMaxGroup) + 1;
std::vector<int64_t> EncodeInventory(const Inventory& inv);
Inventory DecodeInventory(const int64_t* record);
size_t InventoryRecordSize();

struct RestoreChoice {
  int64_t step = -1;       // -1: nothing to restore
  bool memory = false;     // from the memory tier, else the persisted one
  std::vector<ShareTransfer> plan;  // memory: the shares to rebuild
  std::vector<std::string> sources;  // memory, by rank: "local", "replica", "parity"
  // Why a newer memory checkpoint was not taken ("" when none was newer).
  std::string fallback;
  // A worker that could not look the persisted step up (its rank), else -1.
  int64_t lookup_failed = -1;
  // The rank whose share of the newest step held in memory is lost beyond rebuilding
  // (named in `fallback`), else -1.
  int64_t culprit = -1;
};

// The newest step complete across the mesh, memory or persisted (memory on a tie);
// with `named`, that step alone (step -1 when it is neither complete in memory nor
// persisted). `workers`: ids by rank, for the fallback's words.
RestoreChoice ChooseRestore(const std::vector<Inventory>& by_rank, int64_t mesh_fingerprint,
                            const std::vector<std::string>& workers,
                            std::optional<int64_t> named = std::nullopt);

// The timeline a restore begins: the latest proposed, the same on every worker.
int64_t AgreedTimeline(const std::vector<Inventory>& by_rank);

// The first rank whose trainer asked for another step than rank 0's, else -1.
int64_t DisagreeingRank(const std::vector<Inventory>& by_rank);

}  // namespace tessera::worker
