// A job's runtime: it alone owns the job's machine (job_machine.h) and reads the job's
// inbox (job_inbox.h). It feeds the machine its events, carries out the actions Step
// returns through JobEffects, and feeds back what they produced: an I/O step's result,
// or a worker found dead when tasks were handed out. The effects are an interface, so
// that a test scripts them (tests/unit/job_runtime_test.cc); tesserad's are the
// Service's (job_loop.cc): records persisted, events published, tasks queued for the
// workers, I/O run outside every lock.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "service/job_inbox.h"
#include "service/job_machine.h"

namespace tessera::service {

class JobEffects {
 public:
  virtual ~JobEffects() = default;
  virtual void SetPhase(const JobSpec& spec, const std::string& phase) = 0;
  virtual void SetCheckpointState(const JobSpec& spec, CheckpointState state) = 0;
  // kSetProgress: done_bytes of total_bytes; a save's new join (joined) and whether
  // every worker has joined (complete).
  virtual void SetProgress(const JobSpec& spec, const JobAction& progress) = 0;
  // A round of tasks (kQueueTasks, all or none) or tasks without a round (kSendTasks):
  // handed to the workers, or, when one of them is dead, the event that says so.
  virtual std::optional<JobEvent> QueueRound(const JobSpec& spec, const JobAction& round) = 0;
  virtual std::optional<JobEvent> SendTasks(const JobSpec& spec, const JobAction& tasks) = 0;
  virtual Result<Json> RunIo(const JobSpec& spec, const JobAction& io) = 0;
  virtual void AbandonSave(const JobSpec& spec, const Status& why) = 0;
  virtual void AbortCollective(const JobSpec& spec, const Status& why) = 0;
  virtual void Finish(const JobSpec& spec, const Status& status, Json result) = 0;
  virtual int64_t NowMs() = 0;  // the clock the events carry
};

class JobRuntime {
 public:
  JobRuntime(JobMachine* machine, std::shared_ptr<JobInbox> inbox, JobEffects* effects)
      : machine_(machine), inbox_(std::move(inbox)), effects_(effects) {}

  // Runs the machine to its end; the job's final status.
  Status Run();

 private:
  void Execute(JobAction& action);
  // The next event: what another thread posted comes before the runtime's own events
  // (an I/O step's result), so that a cancel or a dead worker that arrived while an
  // I/O step ran is seen before the machine takes its next step.
  JobEvent Next();

  JobMachine* const machine_;
  const std::shared_ptr<JobInbox> inbox_;
  JobEffects* const effects_;
  std::deque<JobEvent> own_;  // the runtime's events: I/O results, dead workers
};

}  // namespace tessera::service
