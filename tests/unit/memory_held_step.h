// What a worker holds of one step, as the memory tier's choice tests write it.
#pragma once

#include <utility>
#include <vector>

#include "worker/memory_choice.h"

namespace tessera::worker::memory_testing {

inline HeldStep Held(int64_t step, bool own, MemoryPolicy::Mode mode, std::vector<int> ranks, bool red = true) {
  HeldStep h;
  h.step = step;
  h.own = own;
  h.redundancy = red;
  h.mode = mode;
  h.ranks = std::move(ranks);
  return h;
}

}  // namespace tessera::worker::memory_testing
