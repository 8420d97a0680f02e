// The agent's side of memory checkpoints (docs/memory-tier.md): /v1/save with
// "tier": "memory" snapshots and answers; a thread per mesh then sends the
// snapshot's redundancy to the other workers, agrees with them that every share and
// its redundancy are in place, commits, and (rank 0) tells tesserad. A policy
// persists some of them to the root from the RAM copy.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "api/clock.h"
#include "api/names.h"
#include "collectives/group.h"
#include "collectives/tree_gather.h"
#include "worker/agent.h"
#include "worker/borrowed_snapshot.h"
#include "worker/memory_exchange.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

// A mesh runs one memory save and keeps one more waiting; a trainer's save beyond
// that waits for room.
constexpr size_t kMemorySavesQueued = 2;
// How long a memory checkpoint may take from its turn to its commit (joining the
// mesh's memory group included), unless the body's deadline_ms says otherwise: a
// worker that never takes part fails it, named, once this passed.
constexpr int64_t kDefaultMemoryDeadlineMs = 60 * 1000;
constexpr int64_t kMaxMemoryDeadlineMs = 3600 * 1000;
// Replication and persisting run at this nice value: on a host whose cores the
// trainer keeps busy, they take what the trainer leaves, and the trainer's next
// snapshot (its stall) is not slowed by the previous checkpoint's traffic.
constexpr int kBackgroundNice = 10;

void RunInBackground() {
  // Linux: a thread's nice value is its own (setpriority on its thread id).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kBackgroundNice);
}

// The vote of each worker once its exchange is done.
enum Vote : size_t { kStep, kOwnBytes, kMemoryBytes, kPersist, kPolicy, kVoteSize };

}  // namespace

void Agent::SetMemoryChannel(MemoryChannel* channel) {
  memory_channel_ = channel;
  memory_reports_ = std::make_unique<MemoryReports>([this](const std::string& mesh, const Json& body) {
    return control_.Call("PUT", "/api/v1/meshes/" + http::PercentEncode(mesh) + "/memory-checkpoints", body, 10)
        .status();
  });
}

Json Agent::MemorySummary() const {
  Json out = memory_.Summary();
  out["reports_pending"] = memory_reports_ ? memory_reports_->pending() : 0;
  return out;
}

Result<Json> Agent::SaveToMemory(const std::string& mesh, int64_t step, const Json& body,
                                 TrainerSaves::Until until, int64_t timeout_ms) {
  if (memory_channel_ == nullptr) {
    return Unavailable("worker " + id_ + " keeps no memory checkpoints (it has no data port)",
                       {{"worker", id_}, {"field", "tier"}});
  }
  ASSIGN_OR_RETURN(MemoryPolicy policy, MemoryPolicy::FromJson(body));
  ASSIGN_OR_RETURN(SaveRequest request, SaveRequest::FromJson(body, step));
  ASSIGN_OR_RETURN(auto names, OptionalNameList(body, "tensors"));
  ASSIGN_OR_RETURN(std::optional<int64_t> deadline_ms, OptionalInt(body, "deadline_ms"));
  if (deadline_ms && (*deadline_ms < 1 || *deadline_ms > kMaxMemoryDeadlineMs)) {
    return InvalidArgument("deadline_ms must be 1.." + std::to_string(kMaxMemoryDeadlineMs) + " for a memory checkpoint",
                           {{"field", "deadline_ms"}});
  }
  const auto t0 = Clock::now();
  {
    // Room in the mesh's queue: back-pressure, never a skipped step.
    MutexLock lock(mu_);
    const auto until_room = t0 + std::chrono::milliseconds(options_.trainer_wait_ms);
    while (!stopping_) {
      MemoryQueue& q = memory_queues_[mesh];
      if (q.waiting.size() + (q.running ? 1 : 0) < kMemorySavesQueued) break;
      if (!cv_.WaitUntil(mu_, until_room)) {
        return Unavailable("the memory checkpoint of step " + std::to_string(step) + " of mesh " + mesh +
                               " was not taken: the two before it are still being replicated after " +
                               std::to_string(options_.trainer_wait_ms) + " ms",
                           {{"mesh", mesh}, {"step", step}, {"field", "tier"}});
      }
    }
    if (stopping_) return Unavailable("worker " + id_ + " is stopping");
  }
  const auto waited = Clock::now();
  // Borrowed shards are copied here, once: the tier keeps its own bytes. A shard equal
  // to its shard in the checkpoint before shares that one's buffer instead.
  ShardChecksums sums;
  std::shared_ptr<const Snapshot> base = MemoryBase(mesh, &sums);
  ASSIGN_OR_RETURN(auto taken, TrainerSnapshot(mesh, body, names, base.get(), &sums));
  ASSIGN_OR_RETURN(auto snap, OwnSnapshot(std::move(taken), store_, base.get(), &sums));
  const auto snapped = Clock::now();
  trainer_saves_.Snapshotted(mesh, step);
  bool start = false;
  {
    MutexLock lock(mu_);
    MemoryQueue& q = memory_queues_[mesh];
    q.waiting.push_back({step, snap, std::move(base), policy, request, deadline_ms.value_or(kDefaultMemoryDeadlineMs), {}, {}});
    start = !q.running;
    q.running = true;
  }
  if (start) task_threads_.Spawn([this, mesh] { RunMemorySaves(mesh); });
  return AnswerSave(mesh, step,
                    {{"checkpoint", {{"mesh", mesh}, {"step", step}}},
                     {"tier", "memory"},
                     {"snapshot_ms", std::chrono::duration<double, std::milli>(snapped - waited).count()},
                     {"room_wait_ms", std::chrono::duration<double, std::milli>(waited - t0).count()},
                     {"snapshot_bytes", snap->bytes()}},
                    until, timeout_ms);
}

std::shared_ptr<const Snapshot> Agent::MemoryBase(const std::string& mesh, ShardChecksums* sums) {
  {
    MutexLock lock(mu_);
    auto q = memory_queues_.find(mesh);
    // (A reprotect's snapshot is a rebuilt share: no base to take.)
    if (q != memory_queues_.end() && !q->second.waiting.empty() && q->second.waiting.back().rebuilt.empty()) {
      return q->second.waiting.back().snap;
    }
  }
  std::shared_ptr<const MemoryCheckpoint> newest = memory_.Newest(mesh);
  if (!newest) return nullptr;
  for (const ShareHeader::Piece& p : newest->own_header.pieces) (*sums)[{p.tensor.name, p.device}] = p.checksum;
  return newest->own.snapshot();
}

Result<Json> Agent::DoMemorySave(const Task& task) {
  ASSIGN_OR_RETURN(int64_t step, RequiredInt(task.request, "step"));
  const int64_t deadline = task.request.value("deadline_ms", kDefaultMemoryDeadlineMs);
  ASSIGN_OR_RETURN(Json out, SaveToMemory(task.mesh.name, step, task.request, TrainerSaves::Until::kCommitted,
                                          std::max<int64_t>(deadline, 1) + options_.trainer_wait_ms));
  out["bytes"] = out.value("snapshot_bytes", uint64_t{0});
  return out;
}

void Agent::RunMemorySaves(const std::string& mesh) {
  RunInBackground();
  while (true) {
    MemorySave save;
    {
      MutexLock lock(mu_);
      MemoryQueue& q = memory_queues_[mesh];
      if (q.waiting.empty() || stopping_) {
        q.running = false;
        cv_.NotifyAll();
        return;
      }
      save = std::move(q.waiting.front());
      q.waiting.pop_front();
    }
    cv_.NotifyAll();  // room for a trainer waiting in SaveToMemory
    if (!save.rebuilt.empty()) {
      if (Status st = Reprotect(mesh, save); !st.ok()) {
        std::fprintf(stderr, "worker %s: giving rebuilt ranks of mesh %s their redundancy of step %lld back failed: %s\n",
                     id_.c_str(), mesh.c_str(), static_cast<long long>(save.step), st.ToString().c_str());
      }
      continue;
    }
    trainer_saves_.Started(mesh, save.step, "memory");
    ReserveRing(mesh, save);
    bool persist = false;
    std::optional<MemoryCheckpointReport> report;
    Status st = TakeMemoryCheckpoint(mesh, save, &persist, &report);
    // The checkpoint before may be freed at this one's commit: its buffers go back to
    // the pool for the trainer's next snapshot, which may come as soon as it is told.
    save.base.reset();
    if (!st.ok()) {
      memory_.Drop(mesh, save.step);
      std::fprintf(stderr, "worker %s: memory checkpoint step %lld of mesh %s failed: %s\n", id_.c_str(),
                   static_cast<long long>(save.step), mesh.c_str(), st.ToString().c_str());
      trainer_saves_.Ended(mesh, save.step, st);
      continue;
    }
    memory_.Commit(mesh, save.step, WallMs());
    trainer_saves_.Ended(mesh, save.step, Status::Ok());
    if (report) {
      report->timeline = memory_.Timeline(mesh);
      for (const auto& ck : memory_.Committed(mesh)) report->steps.push_back(ck->step);
      memory_reports_->Post(mesh, report->ToJson());
    }
    if (persist) {
      task_threads_.Spawn([this, mesh, save]() { PersistFromMemory(mesh, save); });
    }
  }
}

void Agent::ReserveRing(const std::string& mesh, const MemorySave& save) {
  // From the mesh's second save on (the first tells nothing of what will change), like
  // the shards each save copied, not those it shared with the one before: with the
  // first two snapshots' own, a ring of keep + 1 sets, and a mostly frozen state
  // reserves little. A save that shared some also lets the pool keep no more than
  // `keep` sets of what it copied (a state that froze after a while).
  if (!save.base) return;
  Snapshot copied;
  uint64_t copied_bytes = 0;
  for (const Snapshot::Tensor& t : save.snap->tensors) {
    Snapshot::Tensor& c = copied.tensors.emplace_back(Snapshot::Tensor{t.name, t.desc, {}, {}});
    for (const Snapshot::Shard& shard : t.shards) {
      if (Snapshot::SharedWith(save.base.get(), t, shard)) continue;
      c.shards.push_back(shard);
      copied_bytes += shard.size();
    }
  }
  if (copied_bytes < save.snap->bytes()) {
    store_->TrimSnapshotPool(static_cast<size_t>(copied_bytes * static_cast<uint64_t>(save.policy.keep)));
  }
  {
    MutexLock lock(mu_);
    int64_t& reserved = memory_queues_[mesh].ring_reserved;
    if (reserved >= save.policy.keep - 1) return;
    ++reserved;
  }
  if (Status st = store_->ReserveLike(copied); !st.ok()) {
    std::fprintf(stderr, "worker %s: no spare snapshot buffers for mesh %s: %s\n", id_.c_str(),
                 mesh.c_str(), st.ToString().c_str());
  }
}

Status Agent::TakeMemoryCheckpoint(const std::string& mesh, const MemorySave& save, bool* persist,
                                   std::optional<MemoryCheckpointReport>* report) {
  const MeshPlacement& p = save.snap->placement;
  const std::string what = "memory checkpoint step " + std::to_string(save.step) + " of mesh " + mesh;
  const auto timeout = std::chrono::milliseconds(save.deadline_ms);
  const auto deadline = Clock::now() + timeout;
  bool wish = false;
  int64_t persisted = -1;
  {
    MutexLock lock(mu_);
    MemoryQueue& q = memory_queues_[mesh];
    persisted = q.persisted_step;
    const bool by_steps = save.policy.persist_every_steps > 0 &&
                          (q.persist_asked_step < 0 ||
                           save.step - q.persist_asked_step >= save.policy.persist_every_steps);
    const bool by_time = save.policy.persist_every_s > 0 &&
                         (q.persist_asked_ms < 0 || MonoMs() - q.persist_asked_ms >= save.policy.persist_every_s * 1000);
    wish = by_steps || by_time;
  }
  std::vector<int64_t> votes;
  Status st = memory_channel_->With(p, timeout, what, [&](collectives::Group& group,
                                                         const std::vector<std::string>& addresses) -> Status {
    std::vector<std::string> hosts;
    for (const std::string& a : addresses) hosts.push_back(HostOfAddress(a));
    ASSIGN_OR_RETURN(MemoryLayout layout, PlanMemoryLayout(hosts, save.policy));
    auto ck = std::make_shared<MemoryCheckpoint>();
    ck->mesh = mesh;
    ck->step = save.step;
    ck->rank = p.rank;
    ck->policy = save.policy;
    ck->layout = std::move(layout);
    ck->mesh_fingerprint = MeshFingerprint(p);
    ck->persisted = persisted;
    ck->own = ShareBytes(save.snap);
    // The checkpoint whose shards this one shares: their checksums are known, and its
    // copies' holders keep them (ShareHeader::Piece::same_as).
    std::shared_ptr<const MemoryCheckpoint> base;
    if (save.base) {
      for (const auto& held : memory_.Committed(mesh)) {
        if (held->own.snapshot() == save.base) base = held;
      }
    }
    ck->own_header = DescribeShare(*save.snap, save.step, p.rank, ck->mesh_fingerprint, save.policy.Fingerprint(),
                                   save.request.metadata, base ? save.base.get() : nullptr,
                                   base ? &base->own_header : nullptr);
    ck->own_header.policy = save.policy.ToJson();
    memory_.Begin(ck);
    RETURN_IF_ERROR(ExchangeRedundancy(
        group, *ck, p.workers, [this](size_t n) { return store_->AcquireSnapshotBuffer(n); }, deadline,
        [this, &mesh](int64_t step) { return memory_.Find(mesh, step); }));
    if (options_.after_memory_exchange) options_.after_memory_exchange(*ck);
    std::vector<int64_t> v(kVoteSize);
    v[kStep] = save.step;
    v[kOwnBytes] = static_cast<int64_t>(ck->own.size());
    v[kMemoryBytes] = static_cast<int64_t>(memory_.Bytes(mesh));
    v[kPersist] = wish ? 1 : 0;
    v[kPolicy] = save.policy.Fingerprint();
    // Over a tree: a large mesh's group connects pair by pair (collectives/tree_gather.h).
    ASSIGN_OR_RETURN(votes, collectives::TreeAllGather(group.transport(), std::span<const int64_t>(v), deadline));
    return Status::Ok();
  });
  RETURN_IF_ERROR(st);
  // Every worker holds its share and what it was sent: the same on every worker.
  const size_t n = votes.size() / kVoteSize;
  for (size_t r = 0; r < n; ++r) {
    const int64_t* v = votes.data() + r * kVoteSize;
    const std::string who = MeshCollectives::WorkerName(p, static_cast<int64_t>(r));
    if (v[kStep] != save.step || v[kPolicy] != save.policy.Fingerprint()) {
      return Conflict(what + " failed: worker " + who + " took step " + std::to_string(v[kStep]) +
                          (v[kStep] == save.step ? " with other memory settings" : "") +
                          "; every trainer of the mesh must save the same steps with the same settings",
                      {{"worker", who}, {"rank", r}, {"mesh", mesh}, {"step", save.step}});
    }
    *persist = *persist || v[kPersist] != 0;
  }
  if (*persist) {
    MutexLock lock(mu_);
    MemoryQueue& q = memory_queues_[mesh];
    q.persist_asked_step = save.step;
    q.persist_asked_ms = MonoMs();
  }
  if (p.rank != 0) return Status::Ok();
  MemoryCheckpointReport r;
  r.step = save.step;
  r.redundancy = save.policy.ModeName();
  r.replicas = save.policy.replicas;
  r.group = save.policy.group;
  r.parity = save.policy.parity;
  r.keep = save.policy.keep;
  if (persisted >= 0) r.persisted = persisted;
  for (size_t rank = 0; rank < n; ++rank) {
    const int64_t* v = votes.data() + rank * kVoteSize;
    r.bytes += static_cast<uint64_t>(v[kOwnBytes]);
    r.workers.push_back({MeshCollectives::WorkerName(p, static_cast<int64_t>(rank)),
                         static_cast<int64_t>(rank), static_cast<uint64_t>(v[kMemoryBytes])});
  }
  for (const auto& t : save.snap->tensors) r.tensors.push_back({t.name, t.desc.dtype, t.desc.shape});
  *report = std::move(r);
  return Status::Ok();
}

void Agent::PersistFromMemory(const std::string& mesh, const MemorySave& save) {
  RunInBackground();
  const auto now = Clock::now();
  const auto deadline = now + std::chrono::minutes(30);
  auto staging = SaveStaging(mesh, save.step);
  auto job = staging.ok() ? WriteAndJoin(mesh, save.step, save.request, std::nullopt, save.snap, std::nullopt,
                                         *staging, now, deadline)
                          : Result<std::string>(staging.status());
  Status st = job.status();
  if (job.ok()) st = FollowJob("save", *job, 30 * 60 * 1000).status();
  if (!st.ok()) {
    std::fprintf(stderr, "worker %s: persisting memory checkpoint step %lld of mesh %s failed: %s\n",
                 id_.c_str(), static_cast<long long>(save.step), mesh.c_str(), st.ToString().c_str());
    return;
  }
  MutexLock lock(mu_);
  MemoryQueue& q = memory_queues_[mesh];
  q.persisted_step = std::max(q.persisted_step, save.step);
}

}  // namespace tessera::worker
