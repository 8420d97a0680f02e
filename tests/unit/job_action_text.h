// A job machine's actions as text a reader can follow, one line each, for the
// interaction scripts (job_script.h). Only what is stable goes in: no task ids, no
// times but the machine's own.
//
//   phase write
//   checkpoint writing
//   send tasks: rank 0 snapshot(step 7), rank 1 snapshot(step 7)
//   queue round 1 (32 bytes): rank 0 restore(/root/m/step-7: x), rank 1 restore(...)
//   io merge: x[0:4] in shard-0-t.tsr, x[4:8] in shard-1-t.tsr
//   io commit: plan x[0:4] by rank 0, x[4:8] by rank 1
//   abandon save: deadline_exceeded
//   finish failed: deadline_exceeded: <message> {<details>}
#pragma once

#include <string>
#include <vector>

#include "api/status.h"
#include "api/task_protocol.h"
#include "service/job_machine.h"
#include "storage/save_plan.h"

namespace tessera::service {

// "code: message {details}" ("ok" for a success; no details when there are none).
std::string StatusText(const Status& st);

// One task: its kind and what matters of it, e.g. "snapshot(step 7)".
std::string TaskText(const Task& task);

// A save's plan: "x[0:4] by rank 0, x[4:8] by rank 1" (`tensors`: the names its indexes
// refer to); "nothing" when it is empty.
std::string PlanText(const std::vector<storage::PlannedSlice>& plan,
                     const std::vector<std::string>& tensors);

// One action on one line. `tensors`: the names a commit's plan refers to by index.
std::string ActionText(const JobAction& action, const std::vector<std::string>& tensors);

}  // namespace tessera::service
