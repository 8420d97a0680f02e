// The agent's side of restores from the memory tier (docs/memory-tier.md,
// "Restoring"): the workers of the mesh gather their inventories over the memory
// group, every one computes the same choice (memory_choice.h), lost shares are
// rebuilt from the peers, and each worker copies its share into the trainer's tensors.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <set>

#include "api/clock.h"
#include "collectives/group.h"
#include "collectives/tree_gather.h"
#include "worker/agent.h"
#include "worker/memory_choice.h"
#include "worker/restore_match.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

// What this worker holds of `mesh` under its current identity (`held`). With `verify`,
// the checkpoint a restore most likely takes (`check_step`: the named one, else the
// newest) is checked against its checksums here, so that a damaged copy is left out of
// the choice; without, everything held is offered, and each share is checked where it
// lands (InstallShare). Every checkpoint was checked when it arrived.
Inventory TakeInventory(const std::vector<std::shared_ptr<const MemoryCheckpoint>>& held, int64_t check_step,
                        int64_t fingerprint, const std::string& self, bool verify) {
  Inventory inv;
  inv.mesh_fingerprint = fingerprint;
  for (const auto& ck : held) {
    HeldStep h;
    h.step = ck->step;
    h.mode = ck->policy.mode;
    const bool check = verify && ck->step == check_step;
    const std::string where = " held by " + self + " for step " + std::to_string(ck->step);
    Status own = check ? CheckShare(ck->own_header, ck->own, "its own share" + where) : Status::Ok();
    h.own = own.ok();
    if (!own.ok()) std::fprintf(stderr, "worker %s: %s\n", self.c_str(), own.ToString().c_str());
    if (ck->policy.mode == MemoryPolicy::Mode::kReplica) {
      for (const auto& [rank, copy] : ck->copies) {
        Status st = check ? CheckShare(copy.header, copy.bytes, "the copy of rank " + std::to_string(rank) + where)
                          : Status::Ok();
        if (st.ok()) {
          h.ranks.push_back(static_cast<int>(rank));
        } else {
          std::fprintf(stderr, "worker %s: %s; it is not used\n", self.c_str(), st.ToString().c_str());
        }
      }
      h.redundancy = true;
    } else {
      h.ranks = ck->group;
      h.parity = ck->layout.parity;
      const uint64_t sum = ck->parity.size() > 0 && check
                               ? ShareChecksum(ck->parity.spans()[0].data(), ck->parity.size())
                               : ck->parity_checksum;
      h.redundancy = sum == ck->parity_checksum;
      if (!h.redundancy) {
        std::fprintf(stderr, "worker %s: the parity%s does not match its checksum; it is not used\n",
                     self.c_str(), where.c_str());
      }
    }
    inv.steps.push_back(std::move(h));
  }
  return inv;
}

void LogFreed(const std::string& self, const std::string& mesh, int64_t step, const std::vector<int64_t>& freed) {
  if (freed.empty()) return;
  std::string list;
  for (int64_t s : freed) list += (list.empty() ? "" : ", ") + std::to_string(s);
  std::fprintf(stderr, "worker %s: mesh %s goes back to step %lld: memory checkpoints %s are freed\n", self.c_str(),
               mesh.c_str(), static_cast<long long>(step), list.c_str());
}

bool Lists(const Json& record, const std::string& tier) {
  const Json tiers = record.value("tiers", Json::array());
  return tiers.is_array() && std::find(tiers.begin(), tiers.end(), Json(tier)) != tiers.end();
}

// The committed checkpoints of `mesh` of this identity; those of another (the mesh
// registered again, its workers in another order) are freed, never restored.
std::vector<std::shared_ptr<const MemoryCheckpoint>> HeldUnder(MemoryTier& memory, const std::string& mesh,
                                                                int64_t fingerprint) {
  memory.Rollback(mesh, std::numeric_limits<int64_t>::max(), fingerprint);
  return memory.Committed(mesh);
}

// What of `header`'s tensors the trainer's restore (`body`) writes (restore_match.h).
Result<RestoreMatch> MatchShare(const TensorStore& store, const std::string& self, const std::string& mesh,
                                int64_t step, const Json& body, const ShareHeader& header) {
  ASSIGN_OR_RETURN(auto names, OptionalNameList(body, "tensors"));
  ASSIGN_OR_RETURN(std::optional<bool> strict, OptionalBool(body, "strict"));
  RestoreRequest request{mesh, step, self, names, strict.value_or(true)};
  std::vector<HeldTensor> held;
  for (const TensorInfo& t : store.List()) {
    if (t.mesh == mesh) held.push_back({t.name, t.desc});
  }
  return MatchCheckpoint(request, held, header.Tensors());
}

// Where a copy received for this worker lands: each piece the restore writes into a
// shard the trainer mapped, straight into it; the rest (and everything when the
// restore would be refused) in a buffer of the share's own, for InstallShare.
LandShare LandInMappings(TensorStore& store, const std::string& self, const std::string& mesh, int64_t step,
                         const Json& body) {
  return [&store, self, mesh, step, body](const ShareHeader& header) {
    Landing out;
    out.pieces.resize(header.pieces.size());
    Result<RestoreMatch> match = MatchShare(store, self, mesh, step, body, header);
    if (!match.ok()) return out;
    std::set<std::string> restored;
    for (const Json& t : match->tensors) restored.insert(t.value("name", ""));
    for (size_t i = 0; i < header.pieces.size(); ++i) {
      const ShareHeader::Piece& p = header.pieces[i];
      if (!restored.count(p.tensor.name)) continue;
      std::shared_ptr<ShardBuffer> shard = store.MappedShard(mesh, p.tensor.name, p.tensor.desc(), p.device);
      if (shard == nullptr || shard->size() != p.bytes) continue;
      out.pieces[i] = std::span<uint8_t>(shard->data(), shard->size());
      out.keep.push_back(std::move(shard));
    }
    return out;
  };
}

}  // namespace

Result<Json> Agent::InstallFromMemory(const std::string& mesh, int64_t step, const Json& body,
                                      const ShareHeader& header, const ShareBytes& bytes,
                                      const std::string& source) {
  ASSIGN_OR_RETURN(RestoreMatch match, MatchShare(*store_, id_, mesh, step, body, header));
  std::vector<std::string> restored;
  for (const Json& t : match.tensors) restored.push_back(t.value("name", ""));
  const std::string whose = source == "local" ? "the share of step " + std::to_string(step) + " held by " + id_
                                             : "the share of " + id_ + " for step " + std::to_string(step) +
                                                   " rebuilt from its peers";
  RETURN_IF_ERROR(InstallShare(*store_, mesh, header, bytes, restored, whose)
                      .WithContext("restoring memory checkpoint step " + std::to_string(step) + " of mesh " + mesh));
  uint64_t n = 0;
  for (const ShareHeader::Piece& piece : header.pieces) {
    if (std::find(restored.begin(), restored.end(), piece.tensor.name) != restored.end()) n += piece.bytes;
  }
  return Json{{"checkpoint", {{"mesh", mesh}, {"step", step}}},
              {"tier", "memory"},
              {"source", source},
              {"job", nullptr},
              {"bytes", n},
              {"tensors", restored},
              {"missing", match.missing},
              {"unexpected", match.unexpected},
              {"metadata", header.metadata}};
}

Status Agent::AwaitMemoryQueue(const std::string& mesh, int64_t timeout_ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
  MutexLock lock(mu_);
  while (!stopping_) {
    auto q = memory_queues_.find(mesh);
    if (q == memory_queues_.end() || (!q->second.running && q->second.waiting.empty())) return Status::Ok();
    if (!cv_.WaitUntil(mu_, until)) {
      return Unavailable("the memory checkpoints of mesh " + mesh + " queued on worker " + id_ +
                             " before this restore are still being exchanged after " + std::to_string(timeout_ms) +
                             " ms",
                         {{"mesh", mesh}, {"worker", id_}});
    }
  }
  return Unavailable("worker " + id_ + " is stopping");
}

Result<std::optional<Json>> Agent::RestoreFromMemory(const std::string& mesh, std::optional<int64_t> named,
                                                     const Json& body, int64_t timeout_ms, int64_t* persisted,
                                                     std::string* fallback) {
  ASSIGN_OR_RETURN(MeshPlacement p, Resolver()(mesh));
  // The mesh's memory group runs one thing at a time, in the same order on every
  // worker: the memory saves and reprotects queued here before this restore go first,
  // and what they hold is what this restore offers.
  RETURN_IF_ERROR(AwaitMemoryQueue(mesh, timeout_ms));
  const int64_t fingerprint = MeshFingerprint(p);
  const auto held = HeldUnder(memory_, mesh, fingerprint);
  // The newest persisted step; or the named step's record: whether it is in the root,
  // or in the workers' RAM as rank 0 last reported it.
  auto latest = Checkpoint(mesh, named ? std::to_string(*named) : "latest");
  if (named) {
    const bool in_root = latest.ok() && latest->value("state", "") == "committed" &&
                         (!latest->contains("tiers") || Lists(*latest, "persisted"));
    const bool in_ram = latest.ok() && Lists(*latest, "memory");
    if (memory_channel_ == nullptr || in_root || (held.empty() && !in_ram)) {
      // A persisted step (or one of a mesh whose workers keep no memory checkpoints) is
      // the same on every worker: restored alone, from this worker's RAM when it holds
      // its share, else from the root. The timeline goes on from it.
      if (in_root) {
        const int64_t timeline = std::max(WallMs(), memory_.Timeline(mesh) + 1);
        LogFreed(id_, mesh, *named, memory_.Rollback(mesh, *named, fingerprint, timeline));
      }
      for (const auto& ck : held) {
        if (ck->step != *named) continue;
        Result<Json> out = InstallFromMemory(mesh, *named, body, ck->own_header, ck->own, "local");
        if (out.ok()) return std::optional<Json>(std::move(*out));
        if (out.status().code() != Code::kDataLoss) return out.status();
        // Damaged here: the root's copy overwrites what was written.
        std::fprintf(stderr, "worker %s: %s; restoring from the root\n", id_.c_str(), out.status().ToString().c_str());
      }
      return std::optional<Json>();
    }
  }
  if (memory_channel_ == nullptr) {
    return Unavailable("worker " + id_ + " cannot agree on the latest step with its peers (it has no data port)",
                       {{"worker", id_}});
  }
  const int64_t check_step = named.value_or(held.empty() ? -1 : held.back()->step);
  Inventory inv;
  inv.requested = named.value_or(-1);
  inv.timeline = std::max(WallMs(), memory_.Timeline(mesh) + 1);
  if (named) {
    inv.persisted = -1;  // a named step agreed on is one the root lacks
  } else if (latest.ok()) {
    inv.persisted = latest->value("step", int64_t{-1});
  }
  if (!latest.ok() && latest.status().code() != Code::kNotFound) inv.lookup_failed = true;
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const auto deadline = Clock::now() + timeout;
  const std::string which = named ? "step " + std::to_string(*named) : "the latest step";
  const std::string what = "agreeing on " + which + " of mesh " + mesh +
                           " with its other workers (a restore is made by every trainer of the mesh together)";
  // The first round offers everything held unchecked, and each worker checks its share
  // as it installs it: a local restore is one pass over the bytes. A share that does
  // not match (damaged in RAM, or rebuilt from a damaged copy) sends every worker to a
  // second round, in which what is held is checked before the choice leaves it out.
  for (int round = 0;; ++round) {
    const bool last = round == 1;
    const Inventory base = inv;
    inv = TakeInventory(held, check_step, fingerprint, id_, last);
    inv.requested = base.requested;
    inv.timeline = base.timeline;
    inv.persisted = base.persisted;
    inv.lookup_failed = base.lookup_failed;
    RestoreChoice choice;
    int64_t disagreeing = -1;
    bool lookup_failed = false;
    bool again = false;  // some worker's share did not match: a second round
    std::vector<int64_t> asked;  // by rank
    Result<Json> installed = Internal("not installed");
    ShareHeader rebuilt_header;  // this worker's share, when the restore rebuilt it
    std::shared_ptr<const Snapshot> rebuilt_share;
    RETURN_IF_ERROR(memory_channel_->With(p, timeout, what, [&](collectives::Group& group,
                                                               const std::vector<std::string>&) -> Status {
      const std::vector<int64_t> record = EncodeInventory(inv);
      // Over a tree: a large mesh's group connects pair by pair (collectives/tree_gather.h).
      ASSIGN_OR_RETURN(const std::vector<int64_t> values,
                       collectives::TreeAllGather(group.transport(), std::span<const int64_t>(record), deadline));
      std::vector<Inventory> by_rank;
      for (size_t r = 0; r < p.workers.size(); ++r) {
        by_rank.push_back(DecodeInventory(values.data() + r * InventoryRecordSize()));
        asked.push_back(by_rank.back().requested);
      }
      // Every rank restores the same step, or none does.
      disagreeing = DisagreeingRank(by_rank);
      if (disagreeing >= 0) return Status::Ok();
      choice = ChooseRestore(by_rank, fingerprint, p.workers, named);
      // A worker that could not look the root up fails the restore, unless a named step
      // is restored from memory (the root could not offer a newer one).
      lookup_failed = choice.lookup_failed >= 0 && !(named && choice.memory);
      if (lookup_failed) return Status::Ok();
      if (choice.step >= 0) {
        // The timeline goes on from the step restored: what it held past it is abandoned.
        LogFreed(id_, mesh, choice.step, memory_.Rollback(mesh, choice.step, fingerprint, AgreedTimeline(by_rank)));
      }
      if (!choice.memory) return Status::Ok();
      std::shared_ptr<const MemoryCheckpoint> mine;
      for (const auto& ck : held) {
        if (ck->step == choice.step) mine = ck;
      }
      const std::string source = choice.sources.at(p.rank);
      ShareHeader header;
      ShareBytes bytes;
      Status rebuilt = choice.plan.empty() ? Status::Ok()
                                           : RebuildShares(group, mine.get(), choice.step, choice.plan, p.workers,
                                                           LandInMappings(*store_, id_, mesh, choice.step, body),
                                                           deadline, &header, &bytes);
      if (rebuilt.ok()) {
        installed = source == "local" ? InstallFromMemory(mesh, choice.step, body, mine->own_header, mine->own, source)
                                      : InstallFromMemory(mesh, choice.step, body, header, bytes, source);
        if (installed.ok() && source != "local") {
          // Kept as this worker's share of the step (Reprotect): a copy, since pieces
          // that landed in the trainer's tensors change with its next step.
          auto snap = ShareSnapshot(header, bytes, p);
          if (snap.ok()) rebuilt_share = std::move(*snap), rebuilt_header = header;
        }
      } else {
        installed = rebuilt;
      }
      // Whether every share matched, from every worker: one more small round.
      const int64_t damaged = !installed.ok() && installed.status().code() == Code::kDataLoss ? 1 : 0;
      auto told = collectives::TreeAllGather(group.transport(), std::span<const int64_t>(&damaged, 1), deadline);
      if (!told.ok()) return rebuilt.ok() ? told.status() : rebuilt;
      again = !last && std::count(told->begin(), told->end(), int64_t{1}) > 0;
      return Status::Ok();
    }));
    if (disagreeing >= 0) {
      const std::string other = MeshCollectives::WorkerName(p, disagreeing);
      auto step_name = [](int64_t s) { return s < 0 ? std::string("the latest step") : "step " + std::to_string(s); };
      return Conflict("worker " + other + " of mesh " + mesh + " restores " + step_name(asked[disagreeing]) +
                          " where rank 0 restores " + step_name(asked[0]) +
                          ": every trainer of the mesh must restore the same step, so no worker restores",
                      {{"mesh", mesh}, {"worker", other}, {"rank", disagreeing}});
    }
    if (lookup_failed) {
      if (!latest.ok() && inv.lookup_failed) return latest.status();
      const std::string other = MeshCollectives::WorkerName(p, choice.lookup_failed);
      return Unavailable("worker " + other + " of mesh " + mesh + " could not look up " + which +
                             ", so no worker restores",
                         {{"mesh", mesh}, {"worker", other}});
    }
    *fallback = choice.fallback;
    if (named && choice.step < 0) {
      Json details = {{"mesh", mesh}, {"step", *named}};
      if (choice.culprit >= 0) {
        details["rank"] = choice.culprit;
        details["worker"] = MeshCollectives::WorkerName(p, choice.culprit);
      }
      return NotFound("step " + std::to_string(*named) + " of mesh " + mesh +
                          " is neither persisted nor held in memory by every worker, so no worker restores" +
                          (choice.fallback.empty() ? "" : " (" + choice.fallback + ")"),
                      details);
    }
    if (!choice.memory) {
      *persisted = choice.step;
      return std::optional<Json>();
    }
    if (again) {
      std::fprintf(stderr, "worker %s: a share of step %lld of mesh %s did not match its checksum%s; every worker "
                   "checks what it holds and the mesh chooses again\n", id_.c_str(),
                   static_cast<long long>(choice.step), mesh.c_str(),
                   installed.ok() ? " on another worker" : (" (" + installed.status().ToString() + ")").c_str());
      continue;
    }
    RETURN_IF_ERROR(installed.status());
    if (!choice.plan.empty()) {
      QueueReprotect(mesh, choice.step, RebuiltRanks(choice.plan), std::move(rebuilt_header),
                     std::move(rebuilt_share));
    }
    return std::optional<Json>(std::move(*installed));
  }
}

}  // namespace tessera::worker
