#include "service/job_runtime.h"

namespace tessera::service {

Status JobRuntime::Run() {
  Status outcome = Status::Ok();
  JobActions actions = machine_->Step(JobEvent::Start(effects_->NowMs()));
  while (true) {
    for (JobAction& a : actions) {
      if (a.kind == JobAction::Kind::kFinish) outcome = a.status;
      Execute(a);
    }
    if (machine_->ended()) return outcome;
    actions = machine_->Step(Next());
  }
}

JobEvent JobRuntime::Next() {
  if (own_.empty()) return inbox_->Next(machine_->deadline_ms());
  if (auto posted = inbox_->TryNext()) return std::move(*posted);
  JobEvent e = std::move(own_.front());
  own_.pop_front();
  return e;
}

void JobRuntime::Execute(JobAction& a) {
  const JobSpec& spec = machine_->spec();
  switch (a.kind) {
    case JobAction::Kind::kSetPhase:
      effects_->SetPhase(spec, a.phase);
      return;
    case JobAction::Kind::kSetCheckpointState:
      effects_->SetCheckpointState(spec, a.checkpoint_state);
      return;
    case JobAction::Kind::kSetProgress:
      effects_->SetProgress(spec, a);
      return;
    case JobAction::Kind::kQueueTasks:
      if (auto dead = effects_->QueueRound(spec, a)) own_.push_back(std::move(*dead));
      return;
    case JobAction::Kind::kSendTasks:
      if (auto dead = effects_->SendTasks(spec, a)) own_.push_back(std::move(*dead));
      return;
    case JobAction::Kind::kRunIo: {
      Result<Json> done = effects_->RunIo(spec, a);
      own_.push_back(JobEvent::IoDone(effects_->NowMs(), std::move(done)));
      return;
    }
    case JobAction::Kind::kAbandonSave:
      effects_->AbandonSave(spec, a.status);
      return;
    case JobAction::Kind::kAbortCollective:
      effects_->AbortCollective(spec, a.status);
      return;
    case JobAction::Kind::kFinish:
      effects_->Finish(spec, a.status, std::move(a.result));
      return;
  }
}

}  // namespace tessera::service
