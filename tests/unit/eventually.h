// Waiting in tests on what can be observed (a gauge, a counter, a state), never
// on time alone: the condition is polled until it holds or `timeout` passes. The
// timeout is only reached when the code under test is broken, so it is generous.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace tessera::testing {

inline bool Eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace tessera::testing
