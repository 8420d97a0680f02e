// The commands of a job interaction script (tests/unit/testdata/jobs/*.txt, in the
// format of interaction_script.h): a script declares the tensors the workers hold,
// creates a job's state machine and feeds it events. An event prints the actions Step
// returned, one a line (job_action_text.h), then "deadline N" when the machine's
// deadline moved, or "ended" when the job ended; "(no actions)" when it did nothing.
//
// The job: id j-1, on mesh m, whose workers are w-0, w-1, … by rank; checkpoint root
// /root. A new job command starts a new machine (and its clock) in the same file.
//
//   tensor name=x shape=8,4 layout=data,unsharded [dtype=float32]
//       a tensor every worker holds (what a save's joins snapshot, what a restore reads)
//   save mesh=data:2 step=7 [devices_per_worker=1] [from_loop=false]
//        [wait_for_trainer=false] [join_wait_ms=0] [timeout_ms=1800000]
//       a SaveMachine; prints the workers and the plan (storage::PlanSave) of the tensors
//   restore mesh=data:2 step=7 [ranks=0,1] [timeout_ms=1800000]
//   collective mesh=data:2 op=all_reduce [timeout_ms=10000]
//   self_test mesh=data:2 [timeout_ms=10000]          (a mesh_init)
//   verify mesh=data:2 step=7
//
// Events; now= defaults to the time of the one before, and time never goes back:
//   start | cancel | tick | stop  [now=]
//   join rank=1           rank 1's join: its snapshot of the tensors, and a fragment of
//                         the slices the plan gives it (shard-1-t.tsr, a chunk a slice)
//        [error="disk full" code=resource_exhausted]    a join with an error instead
//        [bad_fragment=extra_slice|missing_slice|foreign_file|torn_chunks|none]
//        [bad_snapshot=wrong_devices|missing_tensor]
//   task_ok rank=0 [round=<the last queued>] [result=<json>]
//   task_failed rank=0 error="..." [code=internal] [round=]
//   worker_dead worker=w-1 silent_ms=9000
//   io_done [result=<json>]   |   io_done error="..." [code=internal]
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "api/status.h"
#include "interaction_script.h"
#include "service/job_machine.h"

namespace tessera::service {

class JobScript {
 public:
  // Runs one command: its output, or what is wrong with the script.
  Result<std::string> Run(testing::ScriptCommand& cmd);

 private:
  Result<std::string> DeclareTensor(testing::ScriptCommand& cmd);
  Result<std::string> CreateJob(testing::ScriptCommand& cmd);
  Result<std::string> Deliver(testing::ScriptCommand& cmd);
  Result<JobEvent> EventOf(testing::ScriptCommand& cmd, int64_t now);
  Result<SaveJoinRequest> JoinOf(testing::ScriptCommand& cmd, int64_t rank);
  // The job's mesh from mesh=data:2,model:2 and devices_per_worker=.
  Result<MeshRecord> MeshOf(testing::ScriptCommand& cmd);
  // Every declared tensor's layout fits the job's mesh.
  Status TensorsFit() const;
  std::vector<std::string> TensorNames() const;

  std::vector<TensorMeta> tensors_;
  std::unique_ptr<JobMachine> machine_;
  MeshRecord mesh_;
  int64_t step_ = 0;
  int64_t now_ = 0;
  int64_t round_ = 0;  // the last round queued
  int64_t deadline_ = 0;
};

}  // namespace tessera::service
