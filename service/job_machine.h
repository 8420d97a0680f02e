// Jobs as state machines. A job (save, restore, verify, collective, mesh_init, export,
// import) is a JobMachine: Step(event) moves it from state to state and returns the
// actions its loop must carry out. Step is pure: no locks, no I/O, no clock but the event's, so
// tests drive a machine by feeding events (tests/unit/job_machine_test.cc).
//
// Events: the job starts; a task of the current round ended (succeeded or failed);
// a worker was declared dead; a worker joined a save with what it wrote; an
// I/O step the loop ran is done; a cancel; a tick of the clock (deadlines); shutdown.
// Actions: set the phase; queue a round of tasks (one per rank); send tasks whose
// answers come otherwise (a save's snapshot tasks: joins); run an I/O step; set the
// checkpoint's state; abort the job on the workers; finish.
//
// The loop around a machine (Service::DriveJob, job_loop.cc) delivers tasks, runs
// the I/O outside every lock, persists records and publishes events.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/requests.h"
#include "api/status.h"
#include "api/task_protocol.h"
#include "service/records.h"
#include "storage/fragment_json.h"
#include "storage/save_plan.h"

namespace tessera::service {

struct JobEvent {
  enum class Kind {
    kStart,       // now_ms
    kTaskEnded,   // round, rank, ok, result / error
    kWorkerDead,  // worker, silent_ms
    kJoined,      // rank, join (a worker's join of a save: its snapshot and its write)
    kIoDone,      // ok, result / error (the I/O step the machine asked for)
    kCancel,
    kTick,        // now_ms
    kStop,        // tesserad is shutting down
  };
  Kind kind = Kind::kTick;
  int64_t now_ms = 0;  // every event carries the loop's clock (MonoMs, or a test's)
  int64_t round = 0;
  int64_t rank = -1;
  bool ok = true;
  Json result;
  Status error;
  std::string worker;
  int64_t silent_ms = 0;
  std::shared_ptr<const SaveJoinRequest> join;

  static JobEvent Start(int64_t now) { return Make(Kind::kStart, now); }
  static JobEvent Tick(int64_t now) { return Make(Kind::kTick, now); }
  static JobEvent Cancel(int64_t now) { return Make(Kind::kCancel, now); }
  static JobEvent Stop(int64_t now) { return Make(Kind::kStop, now); }
  static JobEvent TaskSucceeded(int64_t now, int64_t round, int64_t rank, Json result);
  static JobEvent TaskFailed(int64_t now, int64_t round, int64_t rank, Status error);
  static JobEvent WorkerDead(int64_t now, std::string worker, int64_t silent_ms);
  static JobEvent Joined(int64_t now, int64_t rank, SaveJoinRequest join);
  static JobEvent IoDone(int64_t now, Result<Json> result);

 private:
  static JobEvent Make(Kind kind, int64_t now);
};

// The I/O steps a loop runs for its machine, outside every lock.
enum class IoKind {
  kCreateStaging,  // save: the staging dir
  kMerge,          // save, import: fragments (files, or slices) → index.sqlite in staging
  kCommit,         // save: staging → step-<N>, the record filled from the index → {checkpoint, bytes_per_rank}
  kRetention,      // save: the mesh's retention policy → {} or {retention_error}
  kFindCommitted,  // restore: the committed dir → {dir}
  kVerify,         // verify: every chunk → the report (error: the corruption found)
  kReadSafetensors,   // import: io_input {source} → {files: [{path, bytes, tensors}]}
  kWriteExportIndex,  // export: io_input {dir, files} → model.safetensors.index.json
};
std::string_view IoKindName(IoKind kind);

struct JobAction {
  enum class Kind {
    kSetPhase,            // phase
    kSetCheckpointState,  // checkpoint_state (save)
    kQueueTasks,          // round, tasks (by rank), total_bytes
    kSendTasks,           // tasks (by rank): no round; their answers come as other events
    kSetProgress,         // done_bytes of total_bytes (a save: what its joins say was written)
    kRunIo,               // io, fragments or slices (merge), plan (commit)
    kAbandonSave,         // status: checkpoint failed, workers drop snapshots, staging removed
    kAbortCollective,     // status: workers leave the job's collective
    kFinish,              // status, result
  };
  Kind kind = Kind::kFinish;
  std::string phase;
  CheckpointState checkpoint_state = CheckpointState::kPending;
  int64_t round = 0;
  std::map<int64_t, Task> tasks;
  uint64_t total_bytes = 0;
  uint64_t done_bytes = 0;  // kSetProgress
  std::map<int64_t, uint64_t> joined;  // kSetProgress of a save: the new join, rank → bytes
  bool complete = false;               // kSetProgress of a save: every worker has joined
  IoKind io = IoKind::kCreateStaging;
  std::vector<std::string> fragments;                        // merge: files in staging
  std::vector<std::vector<storage::FragmentSlice>> slices;  // merge: the joins' fragments
  // merge, commit of a save: the committed steps its unchanged chunks refer to, held
  // from the merge until the commit (docs/semantics.md, "Incremental checkpoints").
  std::set<int64_t> bases;
  std::vector<storage::PlannedSlice> plan;
  Json io_input;  // what an I/O step reads besides the job's spec
  Status status;
  Json result;
};
using JobActions = std::vector<JobAction>;

// What every machine knows of its job.
struct JobSpec {
  std::string id;
  MeshRecord mesh;  // the mesh it runs on (a restore: the target)
  int64_t step = -1;
  std::string staging;  // a save's staging dir
  std::string staging_id;  // its id in the dir's name (storage::StagingDir); "" for the job's
  int64_t task_timeout_ms = 30 * 60 * 1000;  // a round of tasks ends failed after this
  std::string checkpoint_mesh;  // a restore onto another mesh: the checkpoint's
  // What the job holds until it ends (service/mesh_registry.h, checkpoint_registry.h):
  // the mesh it runs on, and a checkpoint by key ("" for none).
  bool holds_mesh = false;
  std::string held_checkpoint;

  static JobSpec Of(std::string id, MeshRecord mesh, int64_t step, int64_t task_timeout_ms) {
    JobSpec s;
    s.id = std::move(id);
    s.mesh = std::move(mesh);
    s.step = step;
    s.task_timeout_ms = task_timeout_ms;
    return s;
  }
};

class JobMachine {
 public:
  explicit JobMachine(JobSpec spec) : spec_(std::move(spec)) {}
  virtual ~JobMachine() = default;

  // The one entry point: every event goes through here.
  JobActions Step(const JobEvent& e);

  bool ended() const { return ended_; }
  // When the loop must deliver a kTick even if nothing happens (0: no deadline).
  int64_t deadline_ms() const { return deadline_ms_; }
  const JobSpec& spec() const { return spec_; }
  const std::string& phase() const { return phase_; }

 protected:
  // The kind's transitions. A failed Status from any of them ends the job failed
  // (OnFailure gives the actions that clean up first).
  virtual Result<JobActions> OnStart(int64_t now) = 0;
  // The current round of tasks succeeded: results by rank.
  virtual Result<JobActions> OnTasksDone(int64_t now, std::map<int64_t, Json> results);
  virtual Result<JobActions> OnIoDone(int64_t now, Json result);
  virtual Result<JobActions> OnJoined(int64_t now, int64_t rank, const SaveJoinRequest& join);
  // A worker the job waits for outside a task round (a save's joins) died.
  virtual Status OnWorkerDead(const std::string& worker, int64_t silent_ms);
  // The job's deadline passed (a round of tasks: the ranks still missing).
  virtual Status OnDeadline();
  // What a failed job does before it finishes (a save abandons its checkpoint).
  virtual JobActions OnFailure(const Status& st);

  // Helpers for the kinds' transitions.
  JobAction SetPhase(const std::string& phase);
  // A round of tasks, one per rank of `tasks`; it fails after `timeout_ms`.
  JobAction QueueTasks(std::map<int64_t, Task> tasks, uint64_t total_bytes, int64_t now,
                       int64_t timeout_ms);
  // Tasks, one per rank of `tasks`, whose answers are not reports (no round).
  static JobAction SendTasks(std::map<int64_t, Task> tasks);
  JobAction RunIo(IoKind io);
  static JobAction SetCheckpointState(CheckpointState state);
  // A failed job's cleanup action of `kind` (abandon a save, abort a collective).
  static JobAction Cleanup(JobAction::Kind kind, const Status& st);
  JobAction Finish(Json result);
  // Ends the job failed with `st` (and a result, e.g. a verify's report).
  JobActions Fail(const Status& st, Json result = Json());
  // The steps a save shares with an import: the round of write tasks; the merge of the
  // fragments their results name (`what`: "write" or "import", for errors); the commit,
  // after which no cancel counts.
  JobActions WriteRound(std::map<int64_t, Task> tasks, uint64_t total_bytes, int64_t now);
  Result<JobActions> MergeWritten(const std::map<int64_t, Json>& results, const std::string& what);
  JobActions CommitStep(std::vector<storage::PlannedSlice> plan);
  // A wait outside a task round (joins) with its own deadline.
  void WaitUntil(int64_t deadline_ms) {
    waiting_ = Waiting::kOther;
    deadline_ms_ = deadline_ms;
  }
  // From here on a cancel is ignored (a save whose commit has begun ends as it ends).
  void NoMoreCancel() { cancellable_ = false; }
  // A cancel during an I/O step ends the job once the step is done.
  bool cancel_requested() const { return cancel_requested_; }

  const JobSpec spec_;

 private:
  enum class Waiting { kNothing, kTasks, kIo, kOther };
  struct RoundTask {
    std::string worker;
    bool done = false;
    Json result;
  };
  JobActions Apply(Result<JobActions> next);
  Result<JobActions> OnTaskEnded(const JobEvent& e);

  std::string phase_;
  Waiting waiting_ = Waiting::kNothing;
  int64_t round_ = 0;
  std::map<int64_t, RoundTask> tasks_;  // the current round, by rank
  int64_t deadline_ms_ = 0;
  bool cancel_requested_ = false;
  bool cancellable_ = true;
  bool ended_ = false;
};

}  // namespace tessera::service
