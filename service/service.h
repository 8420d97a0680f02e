// tesserad's core: the registries (workers and their liveness, meshes, checkpoints,
// jobs; the meshes' memory tiers, in memory only), the catalog that persists them, and the
// jobs that drive workers through the protocol of docs/architecture.md. HTTP handlers
// (routes.cc) are thin wrappers over these methods, which tests call directly.
//
// Locking: each registry has its own lock, held for its memory alone; none is held
// while another registry works or during I/O (catalog writes included), so a
// request that spans registries takes them one after the other. What must not change
// under a job (its mesh, its checkpoint) is held by the job until it ends.
//
// Writes: every change of state goes root → catalog → memory (state_write.h), so memory
// never shows what is not stored; a failure is counted and returned, never swallowed.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <set>
#include <thread>
#include <vector>

#include "http/router.h"
#include "http/server.h"
#include "api/json_codec.h"
#include "api/requests.h"
#include "api/status.h"
#include "api/task_protocol.h"
#include "api/thread_annotations.h"
#include "service/base_use.h"
#include "service/catalog.h"
#include "service/checkpoint_registry.h"
#include "service/coordination.h"
#include "service/events.h"
#include "service/job_inbox.h"
#include "service/job_machine.h"
#include "service/job_registry.h"
#include "service/memory_checkpoints.h"
#include "service/mesh_roots.h"
#include "service/mesh_registry.h"
#include "service/metrics.h"
#include "service/records.h"
#include "service/state_write.h"
#include "service/worker_registry.h"
#include "service/write_turns.h"
#include "storage/checkpoint_dir.h"
#include "storage/env.h"
#include "storage/save_plan.h"
#include "storage/save_transaction.h"
#include "storage/thread_pool.h"

namespace tessera::service {

struct ServiceOptions {
  std::string data_dir;
  std::string checkpoint_root;
  std::string s3_endpoint;      // of an s3:// root; told to workers
  int64_t heartbeat_ms = 500;   // told to workers
  int64_t suspect_ms = 1500;    // no heartbeat for this long → suspect
  int64_t lease_ms = 3000;      // → dead; jobs needing the worker fail
  int64_t job_timeout_ms = 30 * 60 * 1000;
  // What the leases, heartbeats, job timeouts and schedules here read (api/clock.h).
  Clock* clock = RealClock();
  int64_t max_wait_ms = 60000;  // cap for long-polls
  // Every this often, leftovers of failed saves (staging dirs, late writes of
  // workers that were cut off, unfinished uploads) are removed; 0: only at
  // startup and one lease after each failed save.
  int64_t gc_interval_ms = 5 * 60 * 1000;
  // Job history (job_history.cc): a finished job is kept while it is one of the
  // last job_history_per_mesh finished jobs of its mesh, or ended less than
  // job_history_min_age_ms ago. Checkpoint records are not jobs: they stay while
  // their checkpoint does.
  int64_t job_history_per_mesh = 1000;
  int64_t job_history_min_age_ms = 60 * 1000;
  // An in-loop save waits this long for every trainer of its mesh to join it.
  int64_t join_wait_ms = 120 * 1000;
  // The root's epoch this tesserad holds (service/root_fence.h), carried by its job
  // ids; 0: none (tests that build a Service alone).
  int64_t epoch = 0;
  // Ok while this tesserad may change the root; called before every commit, delete,
  // garbage collection and mesh document, with what it is about to do. Unset: always.
  std::function<Status(const std::string& what)> fence;
  // Who leads and since when, for /healthz, /metrics and /api/v1/cluster.
  std::function<Json()> leadership;
  // Called once a long-poll's answer is built, before it goes: an error is answered instead
  // (to the worker the answer is lost; its tasks stay leased). Unset: nothing. Tests only.
  std::function<Status(const std::string& worker, size_t tasks)> after_poll;
};

struct MeshRequest;  // meshes.cc

// A mesh's state in the stores: its record (none: not registered) and retention policy.
struct MeshState {
  std::optional<MeshRecord> record;
  RetentionPolicy retention;
};

class Service {
 public:
  // Opens the catalog, recovers from a previous run (running jobs → failed,
  // staging dirs removed, committed dirs reconciled) and loads everything.
  static Result<std::unique_ptr<Service>> Create(ServiceOptions options, storage::Env* env);
  ~Service();

  void AddRoutes(http::Router* router);
  // Starts the liveness monitor.
  void Start();
  // Wakes every waiter, fails running jobs' waits and joins threads.
  void Stop();

  EventBus* events() { return &events_; }
  Metrics* metrics() { return &metrics_; }

  // Workers (internal endpoints first).
  Result<Json> RegisterWorker(const Json& body);
  Result<Json> Heartbeat(const std::string& id);
  // {tasks, ack, queue} and, when the worker's placements are older, {meshes, meshes_version}.
  Result<Json> PollTasks(const std::string& id, PollRequest request);
  Status ReportTask(const std::string& worker, const std::string& task, const Json& body);
  Json ListWorkers();
  Result<Json> GetWorker(const std::string& id);
  Status DeleteWorker(const std::string& id);

  // Meshes. PutMesh returns (http status 200|201, mesh).
  Result<std::pair<int, Json>> PutMesh(const std::string& name, const Json& body);
  Json ListMeshes();
  Result<Json> GetMesh(const std::string& name);
  Status DeleteMesh(const std::string& name);

  // Checkpoints and jobs.
  Result<Json> StartSave(const std::string& mesh, const SaveRequest& request);
  // A REST save with "tier": "memory" (docs/memory-tier.md): a memory_save task per
  // worker, each taking its part as its trainer would; the job succeeds once every
  // worker's memory checkpoint committed. The workers check the memory fields.
  Result<Json> StartMemorySave(const std::string& mesh, const Json& body);
  // POST .../checkpoints/{step}/persist (docs/memory-tier.md, "Persisting one now"):
  // a save job whose workers write their shares of memory checkpoint `step` from RAM
  // (SaveRequest::from_memory). Body: {compression?, level?}. not_found when the mesh's
  // memory tier does not hold the step; conflict when it is in the root already.
  Result<Json> StartPersist(const std::string& mesh, const std::string& step, const Json& body);
  // The in-loop save's create-or-join (save_join.cc): (201, {job, checkpoint}) when
  // this call created the save, (200, ...) when it joined the same save (also when
  // it repeats an earlier join); conflict for a committed step or another save of it.
  Result<std::pair<int, Json>> JoinSave(const std::string& mesh, const SaveJoinRequest& join);
  // Both tiers: the catalog's checkpoints and what the mesh's memory tier holds, each
  // entry with its `tiers` (memory_checkpoints.h).
  Result<Json> ListCheckpoints(const std::string& mesh);
  // A step of the catalog, or one only the memory tier holds; "latest" is the newest
  // committed in the catalog (what workers restore from the root).
  Result<Json> GetCheckpoint(const std::string& mesh, const std::string& step);
  // Rank 0's report of the mesh's memory tier, as the route decoded it (a decoding error
  // is counted, then returned): {"acknowledged": true}, with "ignored" when a report of a
  // newer step is held. Checks its workers against the mesh's.
  Result<Json> ReportMemoryCheckpoints(const std::string& mesh,
                                       const Result<MemoryCheckpointReport>& report);
  // In the mesh's root turn (mesh_roots.h), so no commit, retention or sweep of the mesh
  // runs meanwhile.
  Status DeleteCheckpoint(const std::string& mesh, const std::string& step);
  // Root turns of `mesh` taken and not yet passed: tests wait on it to see a writer queued.
  uint64_t RootTurnsQueued(const std::string& mesh) { return mesh_roots_.Queued(mesh); }
  // Removes what failed saves left in the checkpoint root (never a running
  // save's staging): {"removed": [paths]}.
  Result<Json> CollectGarbage();
  // {"status": "ok"} or, after a catalog write failed, "degraded" with the error.
  Json Health() const;
  // Everything a restore needs is checked here (tensors, dtypes, shapes, layouts
  // against the target mesh, workers): what fails is a 400, not a failed job.
  Result<Json> StartRestore(const std::string& mesh, const std::string& step,
                            const RestoreRequest& request);
  Result<Json> StartVerify(const std::string& mesh, const std::string& step);
  // The checkpoint as safetensors files, written by its mesh's workers (a 400 when the
  // checkpoint or its mesh is not there).
  Result<Json> StartExport(const std::string& mesh, const std::string& step, const ExportRequest& request);
  // Safetensors files as a new checkpoint of `mesh`, written by its workers.
  Result<Json> StartImport(const std::string& mesh, const ImportRequest& request);
  Result<Json> PutRetention(const std::string& mesh, const Json& body);
  // POST /api/v1/meshes/{m}/collectives: a job running `op` on every worker.
  Result<Json> StartCollective(const std::string& mesh, const Json& body);
  // Newest first, at most `limit` (1..kMaxJobsPage), only those created before the
  // job whose `seq` is `before` (0: from the newest).
  Result<JobPage> ListJobs(const std::string& state, const std::string& kind,
                           const std::string& mesh, int64_t limit, uint64_t before = 0);
  Result<Json> GetJob(const std::string& id, int64_t wait_ms);
  // Applies the job history policy (ServiceOptions) now; the monitor does every
  // second. Catalog rows go in one transaction.
  void PruneJobHistory();
  Result<Json> CancelJob(const std::string& id);

  // Coordination: barriers and KV go straight to coordination(); preemption is
  // per mesh, so these check the mesh (not_found) and pass its workers along.
  Coordination* coordination() { return coordination_.get(); }
  Result<Json> NoticePreemption(const std::string& mesh, const Json& body);
  Result<Json> GetPreemption(const std::string& mesh);
  Status ClearPreemption(const std::string& mesh);
  Result<Json> SyncPreemption(const std::string& mesh, const Json& body);

  Json Cluster();
  // Where RenderMetrics finds the HTTP server's connection counts. Set before Start.
  void SetServerStats(std::function<http::ServerStats()> stats) { server_stats_ = std::move(stats); }
  std::string RenderMetrics();

 private:
  explicit Service(ServiceOptions options, storage::Env* env, std::unique_ptr<Catalog> catalog);
  Status Recover();
  // The phases of Recover.
  Status RecoverWorkers();
  Status RecoverMeshes();
  Status RecoverJobsAndCheckpoints();
  Status RebuildFromRoot();
  Status AdoptCheckpoints(const std::vector<std::pair<std::string, int64_t>>& missing);
  // The phases of PutMesh.
  Result<std::vector<std::string>> ChooseMeshWorkers(const MeshRequest& r) const;
  Result<Json> SelfTestMesh(const MeshRecord& mesh, int64_t timeout_ms);
  void MonitorLoop();
  void GcLoop();
  // options_.fence, or ok without one.
  Status Fence(const std::string& what) const;
  // A new job's id, carrying this tesserad's epoch ("j<epoch>-<hex>").
  std::string NewJobId() const;
  // Whether garbage collection must keep a staging dir: a job's, while it runs here
  // or when it is of a newer epoch (a leader that took the root from this one); a
  // save's (storage::kSaveStagingId), while its step may still commit.
  bool KeepStaging(const storage::StagingRef& s) const;

  // Catalog writes. A failure is never silent: it is logged, counted, kept for
  // /healthz (which then answers 503 degraded), and returned, so that a request
  // whose record cannot be written fails and leaves memory as it was.
  Status PersistWorker(const WorkerRecord& w);
  Status PersistCheckpoint(const CheckpointRecord& c);
  Status PersistJob(const JobRecord& j);
  Status Persist(const std::string& table, const std::string& key, const Json& doc);
  void NoteCatalogFailure(const std::string& table, const Status& st);
  void PublishWorker(const WorkerRecord& w);
  // A worker as GET /api/v1/workers shows it; `memory_bytes`: memory_checkpoints_.WorkerBytes().
  Json WorkerJson(const WorkerRecord& w, const std::map<std::string, uint64_t>& memory_bytes) const;
  // Every mesh worker `id` belongs to, as GET /api/v1/meshes/{m} shows it.
  Json MeshesOfWorker(const std::string& id) const;
  // A change of state, root → catalog → memory (state_write.h), and its failures' count.
  Status WriteState(const StateWrite& w);
  void CountStateWriteFailure(const std::string& store, const Status& st);
  // ReportMemoryCheckpoints but for its count.
  Result<Json> KeepMemoryReport(const std::string& mesh,
                                const Result<MemoryCheckpointReport>& report);
  // A mesh as memory holds it now (no record: not registered).
  MeshState MeshStateOf(const std::string& name) const;
  // Writes the mesh's document into the root (storage/root_meta.h), or its tombstone.
  Status WriteMeshDoc(const std::string& name, const MeshState& state);
  // The write that takes mesh `name` from `before` to `after` (no record: deleted), its
  // root document put back to `before` if the catalog refuses. REQUIRES: mesh_writes_'s turn.
  StateWrite MeshWrite(const std::string& what, const std::string& name, const MeshState& before,
                       const MeshState& after, std::function<void()> memory);
  // Tells every live worker of `mesh` that job `job_id` failed with `error`: they drop its
  // snapshot and, for a `collective` job, leave its collective.
  void AbortOnWorkers(const MeshRecord& mesh, const std::string& job_id, bool collective,
                      const Status& error);

  // Jobs: each is a state machine (job_machine.h) run by its JobRuntime
  // (job_runtime.h) in DriveJob, with the Service's effects (JobLoopEffects,
  // job_loop.cc), on a thread of its own (Launch) or on the caller's (a mesh's self-test).
  friend class JobLoopEffects;
  // A new job's record, written to the catalog before anyone can see it; the job holds
  // what `spec` says it does. When the catalog refuses it, the job never existed: its
  // holds are released and the error names the catalog.
  Status CreateJob(const JobSpec& spec, const std::string& kind, const std::string& mesh,
                      const Json& request, std::optional<SaveRequest> join = std::nullopt);
  void Launch(std::unique_ptr<JobMachine> machine);
  // Runs the machine to its end; the job's final status.
  Status DriveJob(JobMachine& machine);
  // Queues a round of tasks, all or none: a dead worker is returned as the event.
  std::optional<JobEvent> QueueRound(const JobSpec& spec, const JobAction& action);
  // kSendTasks: the tasks to their workers; a worker missing or dead, as an event.
  std::optional<JobEvent> SendTasks(const JobSpec& spec, const JobAction& action);
  void FinishJob(const JobSpec& spec, const Status& status, Json result);
  void ReleaseHolds(const JobSpec& spec);
  Result<Json> RunJobIo(const JobSpec& spec, const JobAction& action);
  // A save job's transaction (storage/save_transaction.h): stage, merge, commit, abandon.
  storage::SaveTransaction SaveTransactionOf(const JobSpec& spec) const;
  Json VerifyIo(const JobSpec& spec);  // {report, error}
  // A new save job on mesh `mesh` (held by the job `job_id`) and its checkpoint
  // record (pending); `joined`: its workers' snapshots come with their create-or-join
  // calls, not from snapshot tasks. Releases the mesh when it fails.
  // With `import`, the job is that import (ImportMachine) instead of a save.
  Result<CheckpointRecord> CreateSaveJob(const std::string& job_id, const MeshRecord& mesh,
                                         const SaveRequest& request, bool joined,
                                         const ImportRequest* import = nullptr);
  // import: the files of `source` with their checked headers → {files: [...]}.
  Result<Json> ReadSafetensorsIo(const Json& input);
  // export: model.safetensors.index.json of the files written.
  Result<Json> WriteExportIndexIo(const Json& input);
  Json RecordCommitted(const JobSpec& spec, const Json& summary,
                       const std::vector<storage::PlannedSlice>& plan);
  // A failed save: the checkpoint failed, workers drop snapshots, staging removed.
  void AbandonSave(const JobSpec& spec, const Status& st);
  // The garbage collector runs one lease from now (or sooner, if due sooner): after a
  // failed save, and after a late writer's join was refused (its file is gone, its
  // staging dir may be left).
  void CollectGarbageSoon();
  void SetCheckpointState(const std::string& key, CheckpointState state);
  // Pushes an in-loop save's end (committed, or its error) to every worker of its mesh.
  void TellSaveEnded(const JobSpec& spec, const Status& st);
  // Takes the mesh's root turn, chooses the steps to prune and deletes them in it; a step
  // a worker's save may still build on (BaseUse::Floor) waits for a later retention.
  Status ApplyRetention(const std::string& mesh);
  // Before a committed save's retention: until its live workers said they took in its
  // end (at most a lease), when the policy would prune something.
  void AwaitBasesHeard(const JobSpec& spec);
  // Whether a save of `step` of `mesh` may still commit: running, or not yet known here
  // and newer than `newest`, the mesh's newest committed step.
  bool SaveMayCommit(const std::string& mesh, int64_t step, int64_t newest) const;
  // The delete of committed `step`, in `turn` (its mesh's): the root, then the catalog,
  // then memory; then the sweep of the mesh's retired dirs, whose failure is logged and
  // left to the collector (the step is deleted either way).
  Status DeleteInTurn(const MeshRoots::Turn& turn, int64_t step);
  // The collector's sweep of every mesh's retired dirs, each in its mesh's turn.
  Result<std::vector<std::string>> SweepRetiredDirs();

  ServiceOptions options_;
  Clock* const clock_;
  storage::Env* env_;
  std::unique_ptr<Catalog> catalog_;
  EventBus events_;
  std::function<http::ServerStats()> server_stats_;
  Metrics metrics_;
  std::unique_ptr<Coordination> coordination_;  // its own locks

  // The registries, each with its own lock (see the top of this file).
  WorkerRegistry workers_{NewId("q")};
  MeshRegistry meshes_;
  WriteTurns mesh_writes_;  // every change of a mesh, one at a time (root → catalog → memory)
  CheckpointRegistry checkpoints_;
  MeshRoots mesh_roots_;  // every change of a mesh's checkpoints in the root, one at a time
  BaseUse base_use_{clock_};  // what the workers' saves build on, from their long-polls
  MemoryCheckpoints memory_checkpoints_;  // in memory only: rank 0 reports it again
  JobRegistry jobs_{&events_, clock_};

  storage::ThreadSet job_threads_;
  std::thread monitor_;
  std::thread gc_;
  std::atomic<bool> stopping_{false};
  // The monitor's and the GC's schedule.
  Mutex loop_mu_;
  CondVar loop_cv_;
  // When the GC thread should run early (MonoMs), 0: not before its period.
  // A failed save sets it one lease ahead: by then the workers that were still
  // writing have ended, and what they wrote after the failure goes.
  int64_t gc_due_ms_ GUARDED_BY(loop_mu_) = 0;
  std::atomic<uint64_t> catalog_failures_{0};
  mutable Mutex catalog_error_mu_;
  Json catalog_error_ GUARDED_BY(catalog_error_mu_);  // the last failed write
};

}  // namespace tessera::service
