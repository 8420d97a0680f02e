// The worker agent: registers with tesserad, heartbeats, long-polls tasks and
// executes them with the storage engine against the local TensorStore:
//   snapshot  a REST save: copy this worker's shards, write its share, join the save
//   restore   read its devices' slices of a checkpoint (any mesh/layout)
//   abort     leave the collective of a failed job
//   collective  run a REST collectives job's op on tensors of the store
//   mesh_init   the self-test of a newly registered mesh (device-table merge)
// It survives tesserad restarts: on 404 it registers again under the same id.
// Files: agent.cc (lifecycle, task loop), agent_save.cc (a save's write at the
// snapshot, and its join), agent_tasks.cc (restore), agent_collectives.cc
// (collective, mesh_init), agent_trainer.cc (in-loop saves),
// agent_restore.cc (the trainer's restores and checkpoint lookups).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "http/router.h"
#include "api/memory_report.h"
#include "api/requests.h"
#include "api/task_protocol.h"
#include "api/thread_annotations.h"
#include "storage/env.h"
#include "storage/thread_pool.h"
#include "worker/control_plane.h"
#include "worker/mesh_collectives.h"
#include "worker/memory_channel.h"
#include "worker/memory_reports.h"
#include "worker/memory_tier.h"
#include "worker/mesh_placement.h"
#include "worker/placements.h"
#include "worker/save_bases.h"
#include "worker/task_feed.h"
#include "worker/tensor_store.h"
#include "worker/trainer_saves.h"

namespace tessera::worker {

// What a snapshot holds (of `names` only, when given): each tensor and the devices
// of its shards, as a snapshot task reports it and a create-or-join brings it.
SnapshotResult DescribeSnapshot(const Snapshot& snap,
                                const std::optional<std::vector<std::string>>& names);

// Runs a task's handler (`run`) with whatever the caller puts around it: the seam
// for programs that test failures (tests/faults delays tasks through it).
using TaskRunner =
    std::function<Result<Json>(const Task& task, const std::function<Result<Json>()>& run)>;

struct AgentOptions {
  std::string server = "http://127.0.0.1:7070";
  std::string token;
  std::string name;  // stable id "w-<name>" when set
  std::string host = "127.0.0.1";
  int devices = 1;
  int local_port = 0;
  int data_port = 0;
  int io_threads = 2;  // compression / decompression
  int64_t trainer_wait_ms = 120 * 1000;  // a trainer-driven save waits this long for /v1/save
  // In-loop saves whose snapshot no job has taken yet (tesserad away, or slow):
  // /v1/save answers 503 naming the limit while this many are pending, or while
  // they hold max_pending_save_bytes or more (0: no byte limit).
  int64_t max_pending_saves = 4;
  uint64_t max_pending_save_bytes = 0;
  TaskRunner around_task;  // null: tasks just run
  // Called with each memory checkpoint once its exchange is done, before it commits:
  // the seam for programs that test damaged copies (tests/faults flips a bit).
  std::function<void(MemoryCheckpoint& ck)> after_memory_exchange;
};

class Agent {
 public:
  Agent(AgentOptions options, storage::Env* env);
  ~Agent();

  // The store's view of meshes: as tesserad pushed them; fetched only for a mesh not heard of.
  MeshResolver Resolver();
  // The data-port addresses of a mesh's workers, from tesserad (for MeshCollectives).
  PeerAddresses DataAddresses();
  // REQUIRES: called once before Start, with the store the local API serves.
  void SetStore(TensorStore* store) { store_ = store; }
  // REQUIRES: called once before Start.
  void SetCollectives(MeshCollectives* collectives) { collectives_ = collectives; }
  // REQUIRES: called once before Start; without it, memory checkpoints are refused.
  void SetMemoryChannel(MemoryChannel* channel);
  // REQUIRES: before Register.
  void SetLocalPort(int port) { options_.local_port = port; }
  // What the memory tier holds ({"meshes", "bytes", "reports_pending"}), for /healthz.
  Json MemorySummary() const;

  // Registers (retrying until tesserad answers or `timeout_ms` passes).
  Status Register(int64_t timeout_ms);
  void Start();
  void Stop();
  const std::string& id() const { return id_; }

  // Local API: /healthz (the trainer's routes are in trainer_api.h).
  void AddRoutes(http::Router* router);
  // /v1/save: snapshots this worker's tensors of `mesh` (copies of the store's;
  // the body's "borrow": the trainer's memory, read in place, borrowed_snapshot.h)
  // and answers; the job is started or joined in the background. `until` waits further (for the job's
  // id, or the commit) up to `timeout_ms`.
  Result<Json> SaveFromTrainer(const std::string& mesh, int64_t step, const Json& body,
                               TrainerSaves::Until until, int64_t timeout_ms);
  // GET /v1/saves/{step}: what an in-loop save became, waiting up to `timeout_ms` for `until`.
  Result<Json> WaitTrainerSave(const std::string& mesh, int64_t step, TrainerSaves::Until until,
                               int64_t timeout_ms);
  // Restores this worker's devices of `mesh` from `step` (a number, or "latest": the
  // newest step every worker of the mesh saw committed, agreed with them, so every
  // worker's trainer must make the call). Body: {"tensors"?: [names], "strict"?: bool
  // (default true)}; see restore_match.h for what strict refuses.
  // {checkpoint, job, bytes, tensors, missing, unexpected, metadata}.
  Result<Json> RestoreForTrainer(const std::string& mesh, const std::string& step,
                                 const Json& body, int64_t timeout_ms);
  // The mesh's checkpoints {"checkpoints":[...]}, and one checkpoint's record (step a
  // number or "latest": the newest committed), with its tensors and metadata, from tesserad.
  Result<Json> Checkpoints(const std::string& mesh);
  Result<Json> Checkpoint(const std::string& mesh, const std::string& step);
  // agent_read.cc: boxes {tensor, offsets, lengths} of committed checkpoint `step` (or
  // "latest") of `mesh`, read from the root into `out`, one after the other; answers
  // {step, bytes, stored_bytes}. Errors name the read, the tensor or the checkpoint.
  Result<Json> ReadBoxes(const std::string& mesh, const std::string& step, const Json& body,
                         std::string* out);
  // reached_preemption_sync_point: asks tesserad (which decides the sync step).
  Result<Json> PreemptionSyncPoint(const std::string& mesh, int64_t step, int64_t timeout_ms);

 private:
  void HeartbeatLoop();
  void TaskLoop();
  void Execute(const Task& task);
  Result<Json> Run(const Task& task);  // the task's handler (Do*)
  // agent_tasks.cc
  Result<Json> DoRestore(const Task& task);
  Status CheckCollectives() const;  // unavailable when SetCollectives was not called
  Result<Json> DoCollective(const Task& task);
  Result<Json> DoMeshInit(const Task& task);
  // agent_safetensors.cc
  Result<Json> DoExport(const Task& task);
  Result<Json> DoImport(const Task& task);
  void Report(const std::string& task, ReportState state, uint64_t done, uint64_t total,
              const Json& result, const Status& error);
  static MeshPlacement PlacementFromTask(const Task& task);
  // A mesh's placement of this worker, from tesserad (and into placements_).
  Result<MeshPlacement> FetchPlacement(const std::string& mesh);
  void TakeMeshes(const Json& answer);

  // agent_memory.cc
  struct MemorySave {
    int64_t step = 0;
    std::shared_ptr<const Snapshot> snap;
    // The snapshot it shares unchanged shards with (the mesh's memory checkpoint before), or null.
    std::shared_ptr<const Snapshot> base;
    MemoryPolicy policy;
    SaveRequest request;
    int64_t deadline_ms = 0;  // from its turn to its commit
    // Not empty: no save, but the ranks whose shares a restore of `step` rebuilt, to be
    // given their redundancy back (Reprotect); `snap` and `header` are then this
    // worker's rebuilt share when it is one of them.
    std::set<int> rebuilt;
    ShareHeader header;
  };
  // /v1/save with "tier": "memory": waits for room in the mesh's queue, snapshots,
  // queues the exchange (RunMemorySaves) and answers.
  // The snapshot of an in-loop save: `names` (all the mesh's, when unset) from the
  // store, or borrowed where the body's "borrow" names them.
  Result<std::shared_ptr<const Snapshot>> TrainerSnapshot(
      const std::string& mesh, const Json& body, const std::optional<std::vector<std::string>>& names,
      const Snapshot* base = nullptr, const ShardChecksums* base_sums = nullptr);
  // The snapshot a memory save of `mesh` shares unchanged shards with: the newest one
  // waiting, else the own share of the newest checkpoint held, whose checksums (its
  // header's) then go into *sums. Null when none.
  std::shared_ptr<const Snapshot> MemoryBase(const std::string& mesh, ShardChecksums* sums) EXCLUDES(mu_);
  Result<Json> SaveToMemory(const std::string& mesh, int64_t step, const Json& body,
                            TrainerSaves::Until until, int64_t timeout_ms);
  // The mesh's queue of memory saves, one after the other, until it is empty.
  void RunMemorySaves(const std::string& mesh);
  // Sends the redundancy, agrees with the other workers; *persist when any of them
  // asks to persist this step; *report (rank 0): tesserad's report, less "steps".
  Status TakeMemoryCheckpoint(const std::string& mesh, const MemorySave& save, bool* persist,
                              std::optional<MemoryCheckpointReport>* report);
  // A REST save with "tier": "memory": this worker's part, as its trainer's would be
  // (the task's request is the REST body), answered once it committed.
  Result<Json> DoMemorySave(const Task& task);
  // Writes a committed memory checkpoint to the root: the disk save's write and join
  // from the RAM copy.
  void PersistFromMemory(const std::string& mesh, const MemorySave& save);
  // Before the exchange of the mesh's 2nd to keep-th memory checkpoints: one more set
  // of snapshot buffers like what `save` copied, faulted in, in the pool. With the
  // first two snapshots' own, a ring of keep + 1 sets that every later snapshot reuses
  // (the tier holds `keep`; the one being taken needs one): from the third checkpoint
  // on, none copies into fresh pages while its trainer waits.
  void ReserveRing(const std::string& mesh, const MemorySave& save);
  // agent_memory_restore.cc
  // A restore of "latest" (`named` empty) or of a named step with the memory tier in
  // mind: the workers gather their inventories and the step each trainer asked for,
  // each computes the same choice (memory_choice.h), and the timeline goes on from the
  // step chosen; from memory, the lost shares are rebuilt and every worker installs its
  // own. The answer, or, when the choice is the persisted step, nullopt with *persisted
  // and *fallback set. A persisted named step (or one of a mesh whose workers keep no
  // memory checkpoints) is not agreed on: it is the same on every worker, installed
  // from this worker's RAM when it holds its share, else nullopt (read from the root).
  Result<std::optional<Json>> RestoreFromMemory(const std::string& mesh, std::optional<int64_t> named,
                                                const Json& body, int64_t timeout_ms, int64_t* persisted,
                                                std::string* fallback);
  // agent_memory_reprotect.cc
  // After a restore of `step` from memory that rebuilt the shares of `rebuilt`: queued
  // on every worker ahead of the mesh's next memory saves (the same order everywhere),
  // so that the rebuilt ranks hold the step again, their share (`snap`, `header`, on
  // the rebuilt worker) and the copies or parity they held for their peers.
  void QueueReprotect(const std::string& mesh, int64_t step, std::set<int> rebuilt, ShareHeader header,
                      std::shared_ptr<const Snapshot> snap) EXCLUDES(mu_);
  // The queued reprotect's exchange: the rebuilt ranks receive, the others send from
  // the checkpoint they hold; a rebuilt rank commits what it received.
  Status Reprotect(const std::string& mesh, const MemorySave& r);
  // Returns once the mesh's memory queue is empty and idle (unavailable after
  // `timeout_ms`): a restore's agreement then comes after them on every worker.
  Status AwaitMemoryQueue(const std::string& mesh, int64_t timeout_ms) EXCLUDES(mu_);
  // Installs `header`'s pieces of `bytes` that match the trainer's tensors (restore_match.h).
  Result<Json> InstallFromMemory(const std::string& mesh, int64_t step, const Json& body,
                                 const ShareHeader& header, const ShareBytes& bytes,
                                 const std::string& source);

  // agent_save.cc
  // This worker's share of a save, planned from its snapshot alone (storage::PlanSave
  // over the snapshot's tensors: every worker computes the same plan), written into
  // `staging` as shard-<rank>-<tag>.tsr.
  Result<SaveWritten> WriteAtSnapshot(const Snapshot& snap, int64_t step,
                                      const SaveRequest& request, const std::string& job,
                                      const std::string& staging);
  // Writes, then joins the save with what it wrote (or the error), retrying an
  // unreachable tesserad until `deadline`. The job's id, or the refusal; a refused
  // join's file is removed. `snap` is released once written. `sent`: the join's body,
  // for joining again (a job lost with its tesserad).
  Result<std::string> WriteAndJoin(const std::string& mesh, int64_t step, const SaveRequest& request,
                                   const std::optional<std::string>& job,
                                   std::shared_ptr<const Snapshot> snap,
                                   const std::optional<std::vector<std::string>>& names,
                                   const std::string& staging,
                                   std::chrono::steady_clock::time_point snapped,
                                   std::chrono::steady_clock::time_point deadline,
                                   Json* sent = nullptr);
  // Removes the files a refused join's `fragment` (its written.fragment) names in
  // `staging`: nothing will commit them.
  void RemoveWritten(const std::string& staging, const Json& fragment);
  // A persist's snapshot (Task::from_memory): this worker's share of the memory
  // checkpoint of the task's step, and its metadata; not_found naming the worker.
  Result<std::shared_ptr<const Snapshot>> MemoryShareSnapshot(const Task& task, Json* metadata);
  // A REST save's snapshot task: snapshot, write, join.
  void SaveForJob(const Task& task);
  // The staging dir of `step` of `mesh` under the root tesserad gave at registration.
  Result<std::string> SaveStaging(const std::string& mesh, int64_t step);

  // agent_trainer.cc
  // /v1/save's answer `out`, once `until` holds (with the save's job and state).
  Result<Json> AnswerSave(const std::string& mesh, int64_t step, Json out, TrainerSaves::Until until,
                          int64_t timeout_ms);
  // unavailable naming the limit and the pending saves when another in-loop
  // snapshot would pass max_pending_saves or max_pending_save_bytes.
  Status CheckPendingRoom(const std::string& mesh, int64_t step) REQUIRES(mu_);
  uint64_t PendingBytes() const REQUIRES(mu_);  // of trainer_snapshots_
  // {"count", "bytes", "max", "max_bytes"} of the pending in-loop snapshots.
  Json PendingSaves() EXCLUDES(mu_);
  // Writes and joins an in-loop save (WriteAndJoin), and waits for its end (pushed by
  // tesserad as a save_ended task) until `deadline`.
  void FollowTrainerSave(const std::string& mesh, int64_t step, const SaveRequest& request,
                         std::shared_ptr<const Snapshot> snap,
                         const std::optional<std::vector<std::string>>& names,
                         std::chrono::steady_clock::time_point snapped,
                         std::chrono::steady_clock::time_point deadline);
  // The PUT of a join: the job created or joined, retrying an unreachable tesserad
  // with backoff until `deadline`. The error that ends the save otherwise. Each try
  // says how long ago the snapshot was taken (at `snapped`).
  Result<std::string> CreateOrJoinSave(const std::string& mesh, int64_t step, Json body,
                                       std::chrono::steady_clock::time_point snapped,
                                       std::chrono::steady_clock::time_point deadline);
  // The job's final record once it succeeded; its error once it failed.
  Result<Json> FollowJob(const std::string& kind, const std::string& job, int64_t timeout_ms);

  AgentOptions options_;
  storage::Env* env_;
  TensorStore* store_ = nullptr;
  MeshCollectives* collectives_ = nullptr;
  // Set by the first Register, before Start(); a re-registration (from the
  // heartbeat thread) must get the same id back, so every thread may read it.
  std::string id_;
  std::atomic<int64_t> heartbeat_ms_{500};
  storage::ThreadPool io_pool_;
  ControlPlane control_;  // tesserad

  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::string checkpoint_root_ GUARDED_BY(mu_);  // from the registration's answer
  // In-loop saves taken by /v1/save whose join has not been answered, by (mesh, step):
  // their snapshot until it is written, then null.
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<const Snapshot>> trainer_snapshots_
      GUARDED_BY(mu_);
  // Memory saves per mesh: the one running and those waiting, and the persist policy's state.
  struct MemoryQueue {
    std::deque<MemorySave> waiting;
    bool running = false;
    int64_t persist_asked_step = -1;  // the last step the workers agreed to persist
    int64_t persist_asked_ms = -1;
    int64_t persisted_step = -1;  // the last one that committed to the root
    int64_t ring_reserved = 0;    // snapshot buffer sets added to the pool (ReserveRing)
  };
  std::map<std::string, MemoryQueue> memory_queues_ GUARDED_BY(mu_);
  MemoryTier memory_;  // its own lock
  MemoryChannel* memory_channel_ = nullptr;
  std::unique_ptr<MemoryReports> memory_reports_;
  Placements placements_;  // its own lock
  TaskFeed feed_;          // its own lock
  TrainerSaves trainer_saves_;
  SaveBases save_bases_;  // its own lock
  storage::ThreadSet task_threads_;
  std::thread heartbeat_, tasks_;
};

}  // namespace tessera::worker
