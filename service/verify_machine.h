// A verify as a state machine (JobMachine): every chunk read back (I/O).
#pragma once

#include "service/job_machine.h"

namespace tessera::service {

class VerifyMachine : public JobMachine {
 public:
  using JobMachine::JobMachine;

 protected:
  Result<JobActions> OnStart(int64_t now) override;
  // {report, error?}: a corrupt checkpoint fails the job with the report as its result.
  Result<JobActions> OnIoDone(int64_t now, Json result) override;
};

}  // namespace tessera::service
