// tesserad's core: the catalog-backed model (workers, meshes, checkpoints,
// jobs, retention), worker liveness and task delivery, and the save / restore /
// verify jobs that drive workers through the protocol of docs/architecture.md. HTTP handlers
// (routes.cc) are thin wrappers over these methods, which tests call directly.
//
// Locking: one mutex (mu_) guards all state and one condition variable (cv_)
// wakes every waiter (long-polls, job waits) on any change. No file or network
// I/O happens under mu_ except catalog writes.
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
#include <unordered_set>
#include <vector>

#include "http/router.h"
#include "http/server.h"
#include "api/json_codec.h"
#include "api/requests.h"
#include "api/status.h"
#include "api/task_protocol.h"
#include "api/thread_annotations.h"
#include "service/catalog.h"
#include "service/coordination.h"
#include "service/events.h"
#include "service/job_inbox.h"
#include "service/job_machine.h"
#include "service/metrics.h"
#include "service/model.h"
#include "storage/env.h"
#include "storage/index.h"
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
};

// GET /api/v1/jobs answers at most this many jobs a page.
inline constexpr int64_t kMaxJobsPage = 1000;

struct MeshRequest;  // meshes.cc

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
  Result<Json> PollTasks(const std::string& id, int64_t wait_ms);
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
  // The in-loop save's create-or-join (save_join.cc): (201, {job, checkpoint}) when
  // this call created the save, (200, ...) when it joined the same save (also when
  // it repeats an earlier join); conflict for a committed step or another save of it.
  Result<std::pair<int, Json>> JoinSave(const std::string& mesh, const SaveJoinRequest& join);
  Result<Json> ListCheckpoints(const std::string& mesh);
  Result<Json> GetCheckpoint(const std::string& mesh, const std::string& step);
  Status DeleteCheckpoint(const std::string& mesh, const std::string& step);
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
  Result<Json> PutRetention(const std::string& mesh, const Json& body);
  // POST /api/v1/meshes/{m}/collectives: a job running `op` on every worker.
  Result<Json> StartCollective(const std::string& mesh, const Json& body);
  // Newest first, at most `limit` (1..kMaxJobsPage), only those created before the
  // job whose `seq` is `before` (0: from the newest). The JSON array is put
  // together outside the lock from the text of ended jobs.
  struct JobPage {
    std::string json;
    size_t count = 0;
    uint64_t last_seq = 0;  // of the last job listed: the next page's `before`
  };
  Result<JobPage> ListJobs(const std::string& state, const std::string& kind,
                           const std::string& mesh, int64_t limit, uint64_t before = 0);
  Result<Json> GetJob(const std::string& id, int64_t wait_ms);
  // Applies the job history policy (ServiceOptions) now; the monitor does every
  // second. Catalog rows go in one transaction, outside mu_.
  void PruneJobHistory() EXCLUDES(mu_);
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
  Status Recover() EXCLUDES(mu_);
  // The phases of Recover.
  Status RecoverWorkers() REQUIRES(mu_);
  Status RecoverMeshes() REQUIRES(mu_);
  Status RecoverJobsAndCheckpoints() REQUIRES(mu_);
  void AdoptCommittedDirs() REQUIRES(mu_);
  // The phases of PutMesh.
  Result<std::vector<std::string>> ChooseMeshWorkers(const MeshRequest& r) REQUIRES(mu_);
  Result<Json> SelfTestMesh(const std::string& name, int64_t timeout_ms) REQUIRES(mu_);
  void MonitorLoop() EXCLUDES(mu_);
  void GcLoop() EXCLUDES(mu_);

  // Catalog writes. A failure is never silent: it is logged, counted, kept for
  // /healthz (which then answers 503 degraded), and returned, so that a request
  // whose record cannot be written fails and leaves memory as it was.
  Status PersistWorker(const WorkerRecord& w) REQUIRES(mu_);
  Status PersistMesh(const MeshRecord& m) REQUIRES(mu_);
  Status PersistCheckpoint(const CheckpointRecord& c) REQUIRES(mu_);
  Status PersistJob(const JobRecord& j) REQUIRES(mu_);
  Status Persist(const std::string& table, const std::string& key, const Json& doc) REQUIRES(mu_);
  void NoteCatalogFailure(const std::string& table, const Status& st);
  void PublishJob(const JobRecord& j) REQUIRES(mu_);
  // Queues a task for a worker's next long-poll and wakes that poll.
  void QueueTask(WorkerRecord* w, const Task& task) REQUIRES(mu_);
  // Tells every live worker of `mesh` that job `job_id` failed with `error`: they drop its
  // snapshot and, for a `collective` job, leave its collective.
  void AbortOnWorkers(const MeshRecord& mesh, const std::string& job_id, bool collective,
                      const Status& error) REQUIRES(mu_);
  std::vector<std::string> MeshesOfWorker(const std::string& id) const REQUIRES(mu_);
  Status CheckMesh(const std::string& name) const REQUIRES(mu_);  // not_found naming the mesh
  // The mesh, once its self-test has passed: not_found, or unavailable while
  // the test runs.
  Result<const MeshRecord*> ReadyMesh(const std::string& name, const std::string& field = "") const
      REQUIRES(mu_);
  Json MeshJson(const MeshRecord& m) const REQUIRES(mu_);  // the record plus its retention policy
  bool WorkerBusy(const std::string& id) const REQUIRES(mu_);
  Result<CheckpointRecord*> FindCommitted(const std::string& mesh, const std::string& step)
      REQUIRES(mu_);
  JobRecord* NewJob(const std::string& kind, const std::string& mesh, int64_t step,
                    const Json& request) REQUIRES(mu_);
  // Drops a job from memory (its tasks retired); the caller deletes its catalog row.
  void ForgetJob(const std::string& id) REQUIRES(mu_);
  // A task no longer running: a late report of it is accepted and ignored.
  void RetireTask(const std::string& task) REQUIRES(mu_);


  // Jobs: each is a state machine (job_machine.h) driven by DriveJob (job_loop.cc),
  // on a thread of its own (Launch) or on the caller's (a mesh's self-test).
  void Launch(std::unique_ptr<JobMachine> machine);
  // Runs the machine to its end; the job's final status.
  Status DriveJob(JobMachine& machine) EXCLUDES(mu_);
  // Carries out one action; an I/O step's result (or a dead worker found when
  // queueing tasks) goes to `local`, the loop's own events.
  void ExecuteJobAction(JobMachine& machine, JobAction& action, std::deque<JobEvent>* local)
      EXCLUDES(mu_);
  // Queues a round of tasks, all or none: a dead worker is returned as the event.
  std::optional<JobEvent> QueueRound(const JobSpec& spec, const JobAction& action) REQUIRES(mu_);
  Result<Json> RunJobIo(const JobSpec& spec, const JobAction& action) EXCLUDES(mu_);
  // A save job's transaction (storage/save_transaction.h): stage, merge, commit, abandon.
  storage::SaveTransaction SaveTransactionOf(const JobSpec& spec) const;
  Json VerifyIo(const JobSpec& spec) EXCLUDES(mu_);  // {report, error}
  // Posts an event to a running job (none once it has finished).
  void PostToJob(const std::string& job_id, JobEvent e) REQUIRES(mu_);
  // A new save job and its checkpoint record (pending); `joined`: its workers'
  // snapshots come with their create-or-join calls, not from snapshot tasks.
  Result<const CheckpointRecord*> CreateSaveJob(const MeshRecord& m, const SaveRequest& request,
                                                bool joined) REQUIRES(mu_);
  Json RecordCommitted(const JobSpec& spec, const storage::CheckpointIndex& index,
                       const std::vector<storage::PlannedSlice>& plan) REQUIRES(mu_);
  // A failed save: the checkpoint failed, workers drop snapshots, staging removed.
  void AbandonSave(const JobSpec& spec, const Status& st) EXCLUDES(mu_);
  void SetCheckpointState(const std::string& key, CheckpointState state) REQUIRES(mu_);
  // Pushes an in-loop save's end (committed, or its error) to every worker of its mesh.
  void TellSaveEnded(const JobSpec& spec, const Status& st) REQUIRES(mu_);
  JobRecord& BeginJob(const std::string& job_id) REQUIRES(mu_);  // marks it running
  void SetPhase(const std::string& job_id, const std::string& phase) REQUIRES(mu_);
  void FinishJob(const std::string& job_id, const Status& status, Json result) REQUIRES(mu_);
  Status ApplyRetention(const std::string& mesh) EXCLUDES(mu_);

  ServiceOptions options_;
  storage::Env* env_;
  std::unique_ptr<Catalog> catalog_;
  EventBus events_;
  std::function<http::ServerStats()> server_stats_;
  Metrics metrics_;
  std::unique_ptr<Coordination> coordination_;  // its own locks; never waits under mu_

  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, WorkerRecord> workers_ GUARDED_BY(mu_);
  std::vector<std::string> worker_order_ GUARDED_BY(mu_);  // registration order
  uint64_t polls_ GUARDED_BY(mu_) = 0;                     // long-polls started
  int64_t polls_waiting_ GUARDED_BY(mu_) = 0;              // long-polls waiting now
  std::map<std::string, MeshRecord> meshes_ GUARDED_BY(mu_);
  std::map<std::string, CheckpointRecord> checkpoints_ GUARDED_BY(mu_);  // by key()
  std::map<std::string, JobRecord> jobs_ GUARDED_BY(mu_);
  std::map<std::string, std::string> task_jobs_ GUARDED_BY(mu_);  // running task → job
  // In-loop saves still running, by job: the request they were created with (a join
  // must agree with it).
  std::map<std::string, SaveRequest> save_joins_ GUARDED_BY(mu_);
  // Running jobs' inboxes: what their loops hear of (reports, deaths, joins, cancels).
  std::map<std::string, std::shared_ptr<JobInbox>> inboxes_ GUARDED_BY(mu_);
  std::map<uint64_t, std::string> job_order_ GUARDED_BY(mu_);     // by JobRecord::seq
  std::set<std::string> active_jobs_ GUARDED_BY(mu_);            // not finished yet
  uint64_t last_job_seq_ GUARDED_BY(mu_) = 0;
  // Finished jobs of each mesh, in the order they ended: what the history policy prunes.
  std::map<std::string, std::deque<std::string>> finished_jobs_ GUARDED_BY(mu_);
  uint64_t pruned_jobs_ GUARDED_BY(mu_) = 0;
  // Tasks that ended (the newest kRetiredTasks), so late reports need no search.
  static constexpr size_t kRetiredTasks = 65536;
  std::unordered_set<std::string> retired_tasks_ GUARDED_BY(mu_);
  std::deque<std::string> retired_order_ GUARDED_BY(mu_);
  std::map<std::string, RetentionPolicy> retention_ GUARDED_BY(mu_);
  storage::ThreadSet job_threads_;
  std::thread monitor_;
  std::thread gc_;
  // When the GC thread should run early (MonoMs), 0: not before its period.
  // A failed save sets it one lease ahead: by then the workers that were still
  // writing have ended, and what they wrote after the failure goes.
  int64_t gc_due_ms_ GUARDED_BY(mu_) = 0;
  // Every registered worker's heartbeats, for the heartbeat route (which takes
  // this lock, never mu_ unless it revives a dead worker). Taken after mu_.
  Mutex beats_mu_;
  std::map<std::string, std::shared_ptr<WorkerBeat>> beats_ GUARDED_BY(beats_mu_);
  std::atomic<uint64_t> catalog_failures_{0};
  mutable Mutex catalog_error_mu_;
  Json catalog_error_ GUARDED_BY(catalog_error_mu_);  // the last failed write
};

// A random id such as "j-3f9a0c1d2b4e".
std::string NewId(const std::string& prefix);

}  // namespace tessera::service
