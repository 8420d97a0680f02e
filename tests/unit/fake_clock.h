// A Clock for tests (api/clock.h) that moves only when the test calls Advance: leases,
// fences, heartbeats and job timeouts run on it with no real waiting. A waiter on it
// looks at the clock again every millisecond of real time, so an Advance wakes it.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "api/clock.h"

namespace tessera::testing {

class FakeClock final : public Clock {
 public:
  // Starts at an arbitrary, non-zero time (0 means "none" to some callers).
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_(start_ms) {}

  void Advance(int64_t ms) { now_ += ms; }

  int64_t MonoMs() override { return now_.load(); }
  int64_t WallMs() override { return kWallOrigin + now_.load(); }
  bool WaitUntil(CondVar& cv, Mutex& mu, int64_t deadline_ms) override REQUIRES(mu) {
    if (deadline_ms > 0 && now_.load() >= deadline_ms) return false;
    cv.WaitFor(mu, std::chrono::milliseconds(1));
    return deadline_ms <= 0 || now_.load() < deadline_ms;
  }
  void SleepFor(int64_t ms) override {
    const int64_t until = now_.load() + ms;
    while (now_.load() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  static constexpr int64_t kWallOrigin = 1'700'000'000'000;  // 2023-11-14
  std::atomic<int64_t> now_;
};

}  // namespace tessera::testing
