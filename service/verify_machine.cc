#include "service/verify_machine.h"

namespace tessera::service {

Result<JobActions> VerifyMachine::OnStart(int64_t) {
  return JobActions{SetPhase("verify"), RunIo(IoKind::kVerify)};
}

Result<JobActions> VerifyMachine::OnIoDone(int64_t, Json result) {
  Json report = result.value("report", Json());
  if (result.contains("error") && !result["error"].is_null()) {
    return Fail(StatusFromErrorJson(result["error"]), std::move(report));
  }
  return JobActions{Finish(std::move(report))};
}

}  // namespace tessera::service
