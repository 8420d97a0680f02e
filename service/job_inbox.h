// What the service's threads tell a running job (task reports, a dead worker, a
// join, a cancel, shutdown), in the order they happened. One per job; its own lock,
// never held while anything else is.
#pragma once

#include <chrono>
#include <deque>
#include <optional>

#include "api/clock.h"
#include "api/thread_annotations.h"
#include "service/job_machine.h"

namespace tessera::service {

class JobInbox {
 public:
  explicit JobInbox(Clock* clock) : clock_(clock) {}
  void Post(JobEvent e) {
    MutexLock lock(mu_);
    events_.push_back(std::move(e));
    cv_.NotifyAll();
  }
  // The next event if there is one, without waiting.
  std::optional<JobEvent> TryNext() {
    MutexLock lock(mu_);
    if (events_.empty()) return std::nullopt;
    JobEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  // The next event; a tick of the clock once `deadline_ms` (its MonoMs, 0: none) has passed.
  JobEvent Next(int64_t deadline_ms) {
    MutexLock lock(mu_);
    while (events_.empty()) {
      const int64_t now = clock_->MonoMs();
      if (deadline_ms > 0 && now > deadline_ms) return JobEvent::Tick(now);
      clock_->WaitUntil(cv_, mu_, deadline_ms > 0 ? deadline_ms + 1 : 0);
    }
    JobEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  Clock* const clock_;
  Mutex mu_;
  CondVar cv_;
  std::deque<JobEvent> events_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
