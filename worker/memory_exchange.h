// The transfers of the memory tier over a mesh's memory group (docs/memory-tier.md):
// a checkpoint's redundancy when it is taken, and a lost share's rebuild when it is
// restored. Every worker runs the same function with the same layout; each sends
// before it receives (a send never waits for the receiver), and a receiver announces
// its buffer before a share's bytes come, so a share lands where it is kept.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "api/status.h"
#include "collectives/group.h"
#include "worker/memory_tier.h"

namespace tessera::worker {

// Sends this worker's share's redundancy (ck.own, ck.own_header) as ck.layout says and
// receives what it keeps: ck.copies (replica) or ck.group_headers, ck.parity (parity).
// Every copy received is checked against its sender's checksums. `workers`: the
// mesh's worker ids by rank, for messages. What it keeps comes from `acquire`.
// A share's pieces that did not change since the step before (same_as) are not sent
// again to a holder that kept that step's copy: its copy keeps those pieces (their
// buffers shared), found through `held` (this worker's checkpoint of a step of the
// mesh, or null).
// With `only_to`, only the ranks it names receive (what they hold of the step, given
// back after a restore rebuilt their shares: Agent::Reprotect); the others send to them
// from `ck`, a copy of the checkpoint they hold, and keep nothing of it.
using HeldCheckpoint = std::function<std::shared_ptr<const MemoryCheckpoint>(int64_t step)>;
Status ExchangeRedundancy(collectives::Group& group, MemoryCheckpoint& ck,
                          const std::vector<std::string>& workers, const AcquireBuffer& acquire,
                          collectives::Deadline deadline, const HeldCheckpoint& held = {},
                          const std::set<int>* only_to = nullptr);

// One transfer of a restore from memory: `from` holds the share of rank `to` (a copy),
// or the ranks of a parity group rebuild it. Every worker walks the same list.
struct ShareTransfer {
  enum class Kind { kCopy, kParity } kind = Kind::kCopy;
  int64_t to = 0;    // the rank that lost its share
  int64_t from = 0;  // kCopy: the holder
  std::vector<int> group;  // kParity: the group, in group order
  std::vector<int> lost;      // kParity: its members that lost their shares (to is the first)
  std::vector<int> unusable;  // kParity: members that hold their share but no usable parity
  int parity = 1;          // kParity: the losses the group survives
};

// The ranks `rank` sends to or receives from in carrying out `plan` (symmetric).
std::vector<int> PlanPeers(const std::vector<ShareTransfer>& plan, int rank);

// The ranks whose shares `plan` rebuilds (each copy's `to`, each parity group's `lost`).
std::set<int> RebuiltRanks(const std::vector<ShareTransfer>& plan);

// Carries out `plan` for checkpoint `ck` (this worker's, or null when it holds none of
// that step): sends what this worker contributes, and when this worker is a `to`,
// receives its share into *header and *bytes, unchecked (InstallShare checks each
// piece where it lands). A copy's pieces land where `land` says (the trainer's own
// shards: no copy follows); a share rebuilt from parity in a buffer of its own.
// `step` is the step restored.
Status RebuildShares(collectives::Group& group, const MemoryCheckpoint* ck, int64_t step,
                     const std::vector<ShareTransfer>& plan, const std::vector<std::string>& workers,
                     const LandShare& land, collectives::Deadline deadline, ShareHeader* header,
                     ShareBytes* bytes);

}  // namespace tessera::worker
