// The memory tier of each mesh as tesserad knows it: its rank 0's newest report
// (docs/memory-tier.md, "What tesserad knows"). Memory only, never in the catalog: a
// restarted tesserad learns it again from the next report. One lock, held for this map
// alone; reports are handed out as shared, immutable copies, read outside it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/memory_report.h"
#include "api/thread_annotations.h"

namespace tessera::service {

class MemoryCheckpoints {
 public:
  using Report = std::shared_ptr<const MemoryCheckpointReport>;

  // Keeps `report` as the mesh's, replacing the one held, unless that one is newer:
  // of a later timeline, or of the same one with a larger step (reports may arrive out
  // of order). A restore to an earlier step begins a later timeline, whose reports
  // replace the abandoned one's. nullopt when kept, else the step held.
  std::optional<int64_t> Put(const std::string& mesh, MemoryCheckpointReport report);
  Report Get(const std::string& mesh) const;  // null: no report
  void Forget(const std::string& mesh);       // the mesh is gone
  // Each worker's memory bytes, summed over the meshes' reports; a worker in none is absent.
  std::map<std::string, uint64_t> WorkerBytes() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, Report> reports_ GUARDED_BY(mu_);
};

// Where a step is held: ["memory"], ["persisted"] (committed in the checkpoint root),
// both, or neither (a save not committed).
Json Tiers(bool memory, bool persisted);

// GET /api/v1/meshes/{m}/checkpoints: the catalog's entries of the mesh (newest first),
// each with its tiers, and an entry for each step that only `memory` holds, in order.
std::vector<Json> WithMemoryTier(const std::string& mesh, std::vector<Json> persisted,
                                 const MemoryCheckpointReport* memory);

// GET /api/v1/meshes/{m}/checkpoints/{step} of a step that only the memory tier holds:
// committed, with the report's tensors (the newest report's for every step it holds).
Json MemoryCheckpointRecord(const std::string& mesh, const MemoryCheckpointReport& memory,
                            int64_t step);

}  // namespace tessera::service
