// The fault hooks of the test programs tessera-worker-faults and tesserad-faults,
// read from their environment; the shipped programs know none of them.
//   TESSERA_FAULT_TASK_DELAY=kind:ms[,kind:ms]  a worker sleeps before a task of a kind
//                                              (worker only; "write" is a save's write at
//                                              its snapshot), then logs "fault injection:
//                                              the <kind> task of job <id> (mesh <m> step
//                                              <s>), delayed N ms, ended: ..." for tests to
//                                              wait on (job "-": an in-loop save's write,
//                                              before its job is known);
//   TESSERA_FAULT_DISK_FULL_AFTER=bytes         writes through the Env fail with ENOSPC
//                                              once that many bytes were appended;
//   TESSERA_FAULT_S3=text                       S3 requests whose "METHOD URL" holds the
//                                              text get 503 SlowDown without being sent;
//   TESSERA_FAULT_DROP_POLLS=N                  tesserad loses the answers of the first N
//                                              task long-polls that carry tasks (the
//                                              worker gets a 503), logging "fault
//                                              injection: dropped a poll answer ..."
//                                              (tesserad only);
//   TESSERA_FAULT_FLIP_MEMORY_COPY=step         a worker flips a bit in the first copy
//                                              of another rank's share (or its parity) it
//                                              keeps of that memory checkpoint, logging
//                                              "fault injection: flipped a bit in ..."
//                                              (worker only);
//   TESSERA_FAULT_FLIP_MEMORY_OWN=step          the same in its own share of that memory
//                                              checkpoint (worker only).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "api/status.h"
#include "storage/s3/transport.h"
#include "storage/testing/fault_env.h"
#include "worker/agent.h"

namespace tessera::faults {

struct FaultHooks {
  std::map<std::string, int64_t> task_delay_ms;          // by task kind
  std::unique_ptr<storage::FaultEnv> env;                // over DefaultEnv(); null: no disk fault
  std::shared_ptr<storage::s3::Transport> s3_transport;  // null: no S3 fault
  int64_t drop_polls = 0;                                // answers with tasks to lose
  int64_t flip_memory_step = -1;                         // memory checkpoint to damage
  bool flip_own = false;                                 // its own share, not a copy

  // Delays the tasks of task_delay_ms, for a worker's seams; null when there are none.
  worker::TaskRunner TaskDelays() const;
  // Loses the first drop_polls answers that carry tasks, for tesserad's after_poll seam;
  // null when there are none.
  std::function<Status(const std::string& worker, size_t tasks)> DropPolls() const;
  // Damages a copy (or with flip_own its own share) of memory checkpoint flip_memory_step, for a worker's
  // after_memory_exchange seam; null when not asked for.
  std::function<void(worker::MemoryCheckpoint&)> FlipMemoryCopy() const;
};

// The hooks set in this process's environment, each announced on stderr with a
// warning that fault injection is on; `runs_tasks`: false for tesserad, which warns
// that it ignores TESSERA_FAULT_TASK_DELAY (a worker: TESSERA_FAULT_DROP_POLLS). invalid_argument naming a malformed variable.
Result<FaultHooks> LoadFaultHooks(const std::string& program, bool runs_tasks);

}  // namespace tessera::faults
