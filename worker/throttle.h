// Progress reports of a task at most every 100 ms, the first once 100 ms have passed since
// the task began: a task shorter than that sends none.
#pragma once

#include <cstdint>

#include "api/clock.h"

namespace tessera::worker {

class Throttle {
 public:
  static constexpr int64_t kIntervalMs = 100;

  // `now`: when the task began (MonoMs).
  explicit Throttle(int64_t now = MonoMs()) : last_(now) {}
  bool Due(int64_t now = MonoMs()) {
    if (now - last_ < kIntervalMs) return false;
    last_ = now;
    return true;
  }

 private:
  int64_t last_;
};

}  // namespace tessera::worker
