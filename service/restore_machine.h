// A restore as a state machine (JobMachine): plan (find the committed dir, I/O), then
// read: a task per target rank.
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

}  // namespace tessera::service
