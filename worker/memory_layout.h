// Where a memory checkpoint's redundancy goes (docs/memory-tier.md): the policy a
// save asks for, and the layout every worker of the mesh computes the same way from
// the hosts of its ranks. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"

namespace tessera::worker {

struct MemoryPolicy {
  enum class Mode { kReplica, kParity };
  Mode mode = Mode::kReplica;
  int64_t replicas = 1;  // replica mode: copies on other hosts
  int64_t group = 4;     // parity mode: workers per group
  int64_t parity = 1;    // parity mode: losses per group it survives (1: XOR; more: Reed–Solomon)
  int64_t keep = 2;      // memory checkpoints kept per mesh
  int64_t persist_every_steps = 0;
  int64_t persist_every_s = 0;
  bool force = false;  // take it without host diversity

  static constexpr int64_t kMaxReplicas = 3;
  static constexpr int64_t kMaxGroup = 16;
  static constexpr int64_t kMaxParity = 3;
  static constexpr int64_t kMaxKeep = 8;

  // The memory fields of a /v1/save body (docs/memory-tier.md); invalid_argument
  // naming the field.
  static Result<MemoryPolicy> FromJson(const Json& body);
  Json ToJson() const;
  // What every worker must agree on, as one number (persist fields included).
  int64_t Fingerprint() const;
  const char* ModeName() const { return mode == Mode::kReplica ? "replica" : "parity"; }
};

struct MemoryLayout {
  MemoryPolicy::Mode mode = MemoryPolicy::Mode::kReplica;
  // Replica mode, by rank: the ranks that hold its copies, and the ranks whose
  // copies it holds (ascending).
  std::vector<std::vector<int>> targets;
  std::vector<std::vector<int>> sources;
  // Parity mode: the groups' members (each in its own order), and by rank its group;
  // each group survives the loss of `parity` members.
  int parity = 1;
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of;
  // Empty when the redundancy spans hosts as asked; else why not (for the refusal,
  // or the log when forced).
  std::string diversity_problem;
};

// The ranks `rank` exchanges a checkpoint's redundancy with under `layout`: its
// copies' holders and the ranks whose copies it holds (replica), or the other
// members of its group (parity). Symmetric: j is among rank's peers iff rank is
// among j's.
std::vector<int> LayoutPeers(const MemoryLayout& layout, int rank);

// The host of a data-port address "id@host:port" (or "host:port").
std::string HostOfAddress(const std::string& address);

// The layout for ranks on `hosts` (by rank). failed_precondition ("no host
// diversity") when the hosts cannot give what `policy` asks and it is not forced;
// invalid_argument when the mesh is too small for it (one worker, fewer than
// replicas + 1 workers, or a parity group of no more workers than `parity`).
Result<MemoryLayout> PlanMemoryLayout(const std::vector<std::string>& hosts,
                                      const MemoryPolicy& policy);

}  // namespace tessera::worker
