// The two clocks: wall time for timestamps people read, and a monotonic clock for every
// duration, deadline and age (a step of the wall clock must not expire or revive anything).
#pragma once

#include <chrono>
#include <cstdint>

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

}  // namespace tessera
