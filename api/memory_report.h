// Rank 0's report of a mesh's memory tier (docs/memory-tier.md, "What tesserad knows"):
// PUT /api/v1/meshes/{mesh}/memory-checkpoints. Decoded once, at the route, from untrusted
// JSON: every error is invalid_argument naming the field by its path ("workers[1].rank").
// What depends on the mesh (ranks, worker ids) tesserad checks against its record.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/shape.h"
#include "api/status.h"

namespace tessera {

struct MemoryCheckpointReport {
  struct Tensor {
    std::string name;
    DType dtype = DType::kFloat32;
    Shape shape;
  };
  struct Worker {
    std::string worker;
    int64_t rank = 0;
    uint64_t memory_bytes = 0;  // what it holds for the mesh's memory tier
  };

  int64_t step = 0;                    // the memory checkpoint that just committed
  std::string redundancy = "replica";  // "replica" | "parity"
  int64_t replicas = 1;                // copies of each share (replica), 1 or more
  int64_t group = 4;                   // workers per parity group (parity), 2 or more
  int64_t parity = 1;                  // losses each parity group survives (parity), 1 or more
  int64_t keep = 2;                    // memory checkpoints kept, 1 to 16
  std::vector<int64_t> steps;          // every one the workers hold: ascending, holds `step`
  uint64_t bytes = 0;                  // the checkpoint's bytes
  std::vector<Tensor> tensors;         // names unique
  std::vector<Worker> workers;         // ranks unique
  std::optional<int64_t> persisted;    // the newest persisted step the workers know (-1: none)
  // When the workers' timeline of the mesh began (wall ms; 0: not said): a restore to an
  // earlier step begins a later one, whose reports replace those of larger steps.
  int64_t timeline = 0;

  // Required: step, redundancy, steps, bytes, tensors, workers; the rest take the
  // defaults above.
  static Result<MemoryCheckpointReport> FromJson(const Json& body);
  Json ToJson() const;
  Json TensorsJson() const;  // [{name, dtype, shape}]
  bool Holds(int64_t s) const;
};

}  // namespace tessera
