// The job kinds other than a save, as state machines (JobMachine):
//   restore     plan: find the committed dir (I/O) → read: a task per target rank
//   verify      verify: every chunk read back (I/O)
//   collective  the op: a task per rank (also mesh_init, the registration self-test);
//               a failure makes the workers leave the job's collective
#pragma once

#include "service/job_machine.h"

namespace tessera::service {

class RestoreMachine : public JobMachine {
 public:
  // `tensors`: in their target layouts (StartRestore planned them); `ranks`: of the
  // target mesh's workers that read.
  RestoreMachine(JobSpec spec, std::vector<TensorMeta> tensors, std::vector<int64_t> ranks);

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  Result<JobActions> OnIoDone(int64_t now, Json result) override;
  Result<JobActions> OnTasksDone(int64_t now, std::map<int64_t, Json> results) override;

 private:
  const std::vector<TensorMeta> tensors_;
  const std::vector<int64_t> ranks_;
  uint64_t total_ = 0;
};

class VerifyMachine : public JobMachine {
 public:
  using JobMachine::JobMachine;

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  // {report, error?}: a corrupt checkpoint fails the job with the report as its result.
  Result<JobActions> OnIoDone(int64_t now, Json result) override;
};

class CollectiveMachine : public JobMachine {
 public:
  // kind kCollective (request: the REST body) or kMeshInit (the self-test).
  CollectiveMachine(JobSpec spec, TaskKind kind, Json request, int64_t timeout_ms);

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  Result<JobActions> OnTasksDone(int64_t now, std::map<int64_t, Json> results) override;
  JobActions OnFailure(const Status& st) override;

 private:
  const TaskKind kind_;
  const Json request_;
  const int64_t timeout_ms_;
};

}  // namespace tessera::service
