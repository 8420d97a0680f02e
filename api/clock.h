// The two clocks: wall time for timestamps people read, and a monotonic clock for every
// duration, deadline and age (a step of the wall clock must not expire or revive anything).
//
// The clock seam: leases, fences, heartbeats and job timeouts read a Clock, not the free
// functions, so that their tests run on a fake one (tests/unit/fake_clock.h) that moves
// only when the test says, with no real waiting. RealClock() is the one programs use.
#pragma once

#include <chrono>
#include <cstdint>

#include "api/thread_annotations.h"

namespace tessera {

// Milliseconds since the Unix epoch (system clock).
inline int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Milliseconds of the steady clock (arbitrary origin; only differences mean anything).
inline int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t MonoMs() = 0;  // as ::tessera::MonoMs
  virtual int64_t WallMs() = 0;  // as ::tessera::WallMs
  // Waits on `cv` until it is notified or this clock's MonoMs reaches `deadline_ms`
  // (≤ 0: no deadline); false once the deadline has passed. May return early: wait in a
  // loop that checks its condition.
  virtual bool WaitUntil(CondVar& cv, Mutex& mu, int64_t deadline_ms) REQUIRES(mu) = 0;
  // Waits until this clock has moved `ms` on.
  virtual void SleepFor(int64_t ms) = 0;
};

// The system's clocks. Never null; lives as long as the process.
Clock* RealClock();

}  // namespace tessera
