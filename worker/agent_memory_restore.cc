// The agent's side of restores from the memory tier (docs/memory-tier.md,
// "Restoring"): the workers of the mesh gather their inventories over the memory
// group, every one computes the same choice (memory_choice.h), lost shares are
// rebuilt from the peers, and each worker copies its share into the trainer's tensors.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "collectives/collectives.h"
#include "worker/agent.h"
#include "worker/memory_choice.h"
#include "worker/restore_match.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

// What this worker holds of `mesh`. The newest checkpoint, the one a restore almost
// always takes, is checked against its checksums here, so that a damaged copy is left
// out of the choice; an older one was checked when it arrived, and a share rebuilt
// from it is checked again where it lands.
Inventory TakeInventory(const std::vector<std::shared_ptr<const MemoryCheckpoint>>& held,
                        const MeshPlacement& p, const std::string& self) {
  Inventory inv;
  inv.mesh_fingerprint = MeshFingerprint(p);
  for (const auto& ck : held) {
    HeldStep h;
    h.step = ck->step;
    h.mode = ck->policy.mode;
    const bool check = ck == held.back();
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

}  // namespace

Result<Json> Agent::InstallFromMemory(const std::string& mesh, int64_t step, const Json& body,
                                      const ShareHeader& header, const ShareBytes& bytes,
                                      const std::string& source) {
  ASSIGN_OR_RETURN(auto names, OptionalNameList(body, "tensors"));
  ASSIGN_OR_RETURN(std::optional<bool> strict, OptionalBool(body, "strict"));
  RestoreRequest request{mesh, step, id_, names, strict.value_or(true)};
  std::vector<HeldTensor> held;
  for (const TensorInfo& t : store_->List()) {
    if (t.mesh == mesh) held.push_back({t.name, t.desc});
  }
  ASSIGN_OR_RETURN(RestoreMatch match, MatchCheckpoint(request, held, header.Tensors()));
  std::vector<std::string> restored;
  for (const Json& t : match.tensors) restored.push_back(t.value("name", ""));
  RETURN_IF_ERROR(InstallShare(*store_, mesh, header, bytes, restored)
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

Result<std::optional<Json>> Agent::RestoreLatestFromMemory(const std::string& mesh, const Json& body,
                                                           int64_t timeout_ms, int64_t* persisted,
                                                           std::string* fallback) {
  ASSIGN_OR_RETURN(MeshPlacement p, Resolver()(mesh));
  if (memory_channel_ == nullptr) {
    return Unavailable("worker " + id_ + " cannot agree on the latest step with its peers (it has no data port)",
                       {{"worker", id_}});
  }
  // The newest persisted step this worker saw committed, from tesserad.
  auto latest = Checkpoint(mesh, "latest");
  const auto held = memory_.Committed(mesh);
  Inventory inv = TakeInventory(held, p, id_);
  if (latest.ok()) {
    inv.persisted = latest->value("step", int64_t{-1});
  } else if (latest.status().code() != Code::kNotFound) {
    inv.lookup_failed = true;
  }
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const auto deadline = Clock::now() + timeout;
  RestoreChoice choice;
  ShareHeader header;
  ShareBytes bytes;
  std::shared_ptr<const MemoryCheckpoint> mine;
  const std::string what = "agreeing on the latest step of mesh " + mesh +
                           " with its other workers (a restore without a step is made by every trainer of "
                           "the mesh together; to restore alone, name the step)";
  RETURN_IF_ERROR(memory_channel_->With(p, timeout, what, [&](collectives::Group& group,
                                                             const std::vector<std::string>&) -> Status {
    const std::vector<int64_t> record = EncodeInventory(inv);
    collectives::Tensor t = collectives::Tensor::Zeros(DType::kInt64, {static_cast<int64_t>(record.size())});
    std::copy(record.begin(), record.end(), t.values<int64_t>().begin());
    collectives::AllGatherOptions o;
    o.timeout = timeout;
    ASSIGN_OR_RETURN(collectives::Tensor all, collectives::AllGather(group, t, o));
    std::vector<Inventory> by_rank;
    const auto values = all.values<int64_t>();
    for (size_t r = 0; r < p.workers.size(); ++r) {
      by_rank.push_back(DecodeInventory(values.data() + r * InventoryRecordSize()));
    }
    choice = ChooseRestore(by_rank, MeshFingerprint(p), p.workers);
    if (!choice.memory) return Status::Ok();
    for (const auto& ck : held) {
      if (ck->step == choice.step) mine = ck;
    }
    if (choice.plan.empty()) return Status::Ok();
    return RebuildShares(group, mine.get(), choice.step, choice.plan, p.workers, deadline, &header, &bytes);
  }));
  if (choice.lookup_failed >= 0) {
    if (!latest.ok() && inv.lookup_failed) return latest.status();
    const std::string other = MeshCollectives::WorkerName(p, choice.lookup_failed);
    return Unavailable("worker " + other + " of mesh " + mesh + " could not look up the latest step, so no worker restores",
                       {{"mesh", mesh}, {"worker", other}});
  }
  *fallback = choice.fallback;
  if (!choice.memory) {
    *persisted = choice.step;
    return std::optional<Json>();
  }
  const std::string source = choice.sources.at(p.rank);
  if (source == "local" && mine != held.back()) {
    // An older checkpoint was not checked with the inventory.
    RETURN_IF_ERROR(CheckShare(mine->own_header, mine->own,
                               "the share of step " + std::to_string(choice.step) + " held by " + id_));
  }
  Result<Json> out = source == "local" ? InstallFromMemory(mesh, choice.step, body, mine->own_header, mine->own, source)
                                       : InstallFromMemory(mesh, choice.step, body, header, bytes, source);
  RETURN_IF_ERROR(out.status());
  return std::optional<Json>(std::move(*out));
}

}  // namespace tessera::worker
