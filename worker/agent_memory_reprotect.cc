// The agent's side of giving a rebuilt worker its redundancy back (docs/memory-tier.md,
// "Restoring"): a restore from memory that rebuilt some ranks' shares leaves those
// ranks holding nothing of the step, so one more loss before the next checkpoint
// could lose it. Queued on every worker ahead of the mesh's next memory saves, a
// reprotect runs the checkpoint's exchange again with only the rebuilt ranks
// receiving: each gets back the copies (replica) or the parity (parity) it held, and
// keeps its rebuilt share as its own.
#include <chrono>
#include <cstdio>

#include "api/clock.h"
#include "worker/agent.h"
#include "worker/memory_exchange.h"

namespace tessera::worker {
namespace {

// How long a reprotect may take, joining the mesh's memory group included.
constexpr auto kReprotectTimeout = std::chrono::seconds(60);

}  // namespace

void Agent::QueueReprotect(const std::string& mesh, int64_t step, std::set<int> rebuilt, ShareHeader header,
                           std::shared_ptr<const Snapshot> snap) {
  MemorySave r;
  r.step = step;
  r.rebuilt = std::move(rebuilt);
  r.header = std::move(header);
  r.snap = std::move(snap);
  bool start = false;
  {
    MutexLock lock(mu_);
    MemoryQueue& q = memory_queues_[mesh];
    q.waiting.push_back(std::move(r));
    start = !q.running;
    q.running = true;
  }
  if (start) task_threads_.Spawn([this, mesh] { RunMemorySaves(mesh); });
}

Status Agent::Reprotect(const std::string& mesh, const MemorySave& r) {
  ASSIGN_OR_RETURN(MeshPlacement p, Resolver()(mesh));
  const bool mine = r.rebuilt.count(static_cast<int>(p.rank)) > 0;
  const std::shared_ptr<const MemoryCheckpoint> held = memory_.Find(mesh, r.step);
  const std::string what = "giving the ranks rebuilt at step " + std::to_string(r.step) + " of mesh " + mesh +
                           " their redundancy back";
  const auto deadline = std::chrono::steady_clock::now() + kReprotectTimeout;
  std::shared_ptr<MemoryCheckpoint> kept;
  RETURN_IF_ERROR(memory_channel_->With(p, kReprotectTimeout, what, [&](collectives::Group& group,
                                                                       const std::vector<std::string>& addresses) -> Status {
    MemoryCheckpoint ck;
    if (mine) {
      if (!r.snap || !r.header.policy.is_object()) {
        return Conflict("the rebuilt share of rank " + std::to_string(p.rank) +
                                  " does not say the memory settings it was taken with");
      }
      ASSIGN_OR_RETURN(ck.policy, MemoryPolicy::FromJson(r.header.policy));
      if (ck.policy.Fingerprint() != r.header.policy_fingerprint) {
        return Internal("the memory settings in the rebuilt share's header are not those it was taken with");
      }
      std::vector<std::string> hosts;
      for (const std::string& a : addresses) hosts.push_back(HostOfAddress(a));
      ASSIGN_OR_RETURN(ck.layout, PlanMemoryLayout(hosts, ck.policy));
      ck.mesh = mesh;
      ck.step = r.step;
      ck.rank = p.rank;
      ck.mesh_fingerprint = MeshFingerprint(p);
      ck.own = ShareBytes(r.snap);
      ck.own_header = r.header;
    } else if (held == nullptr) {
      return Conflict("worker " + id_ + " no longer holds step " + std::to_string(r.step) + " of mesh " +
                                mesh + " (a newer restore or a checkpoint freed it)",
                                {{"worker", id_}, {"step", r.step}});
    } else {
      ck = *held;  // sends from it; keeps nothing of what this exchange gives it
    }
    RETURN_IF_ERROR(ExchangeRedundancy(
        group, ck, p.workers, [this](size_t n) { return store_->AcquireSnapshotBuffer(n); }, deadline, {},
        &r.rebuilt));
    if (mine) kept = std::make_shared<MemoryCheckpoint>(std::move(ck));
    return Status::Ok();
  }));
  if (kept) {
    memory_.Begin(kept);
    memory_.Commit(mesh, r.step, WallMs());
    std::fprintf(stderr, "worker %s: holds step %lld of mesh %s again (its share and its redundancy)\n", id_.c_str(),
                 static_cast<long long>(r.step), mesh.c_str());
  }
  return Status::Ok();
}

}  // namespace tessera::worker
