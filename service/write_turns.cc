#include "service/write_turns.h"

namespace tessera::service {

WriteTurns::Turn WriteTurns::Take() {
  MutexLock lock(mu_);
  const uint64_t ticket = next_++;
  while (serving_ != ticket) cv_.Wait(mu_);
  return Turn(this);
}

uint64_t WriteTurns::queued() {
  MutexLock lock(mu_);
  return next_ - serving_;
}

void WriteTurns::Pass() {
  {
    MutexLock lock(mu_);
    ++serving_;
  }
  cv_.NotifyAll();
}

}  // namespace tessera::service
