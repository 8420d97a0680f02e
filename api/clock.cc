#include "api/clock.h"

#include <thread>

namespace tessera {
namespace {

class SystemClock final : public Clock {
 public:
  int64_t MonoMs() override { return ::tessera::MonoMs(); }
  int64_t WallMs() override { return ::tessera::WallMs(); }
  bool WaitUntil(CondVar& cv, Mutex& mu, int64_t deadline_ms) override REQUIRES(mu) {
    if (deadline_ms <= 0) {
      cv.Wait(mu);
      return true;
    }
    const int64_t left = deadline_ms - ::tessera::MonoMs();
    if (left <= 0) return false;
    cv.WaitFor(mu, std::chrono::milliseconds(left));
    return ::tessera::MonoMs() < deadline_ms;
  }
  void SleepFor(int64_t ms) override {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
};

}  // namespace

Clock* RealClock() {
  static SystemClock* clock = new SystemClock();  // never destroyed: threads may outlive main
  return clock;
}

}  // namespace tessera
