// A collective as a state machine (JobMachine): the op, a task per rank (also mesh_init,
// the registration self-test); a failure makes the workers leave the job's collective.
#pragma once

#include "service/job_machine.h"

namespace tessera::service {

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
