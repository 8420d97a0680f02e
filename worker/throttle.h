// Progress reports of a task at most every 100 ms.
#pragma once

#include <cstdint>

#include "api/clock.h"

namespace tessera::worker {

class Throttle {
 public:
  bool Due() {
    const int64_t now = MonoMs();
    if (now - last_ < 100) return false;
    last_ = now;
    return true;
  }

 private:
  int64_t last_ = 0;
};

}  // namespace tessera::worker
