// Named barriers of the coordination service (docs/openapi.json "Coordination"): ranks
// 0..world-1 of a job arrive under a name and are released together once all
// have arrived. Kept in memory only: a barrier lives no longer than the HTTP
// calls that wait on it, and those end when tesserad does.
//
// Rules: the first arrival of a round fixes `world`; a different world while
// the round is open, or a rank arriving twice, is a conflict. A completed round
// resets the name for the next generation. A rank whose wait times out leaves
// the round, so a retry is a fresh arrival.
//
// Thread-safe; waiting holds only this object's mutex (released while blocked).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "api/clock.h"
#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"
#include "service/events.h"
#include "service/metrics.h"

namespace tessera::service {

// Largest `world` a barrier accepts: lists of missing ranks stay small.
inline constexpr int64_t kMaxBarrierWorld = 65536;

class Barriers {
 public:
  // `events` and `metrics` may be null (tests); waits, timeouts and waited_ms read `clock`.
  Barriers(EventBus* events, Metrics* metrics, Clock* clock = RealClock())
      : events_(events), metrics_(metrics), clock_(clock) {}

  // Blocks until `world` ranks have arrived at `name` → {name, world, generation, waited_ms};
  // deadline_exceeded after `timeout_ms` with details.missing_ranks / arrived_ranks;
  // conflict for a world mismatch or a duplicate rank; unavailable after Shutdown().
  // REQUIRES: `name` is a valid name, 1 <= world <= kMaxBarrierWorld, 0 <= rank < world.
  Result<Json> Arrive(const std::string& name, int64_t rank, int64_t world, int64_t timeout_ms);

  // Open barriers (at least one rank waiting), by name:
  // [{name, world, generation, arrived_ranks, missing_ranks, waiting_ms}].
  Json List();
  int64_t open_count();

  // Wakes every waiter (they get unavailable) and refuses later arrivals.
  void Shutdown();

 private:
  struct Barrier {
    int64_t world = 0;
    int64_t generation = 0;              // completed rounds of this name
    std::map<int64_t, int64_t> arrived;  // rank → arrival time (ms since epoch)
    int64_t opened_ms = 0;               // first arrival of the current round
  };
  // Drops idle barriers (their generation counts) once there are many names.
  void ForgetIdle() REQUIRES(mu_);
  void Publish(Json event);
  void CountWait(const Status& outcome);

  EventBus* events_;
  Metrics* metrics_;
  Clock* const clock_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  // Waiters hold a reference, so forgetting a name never strands one.
  std::map<std::string, std::shared_ptr<Barrier>> barriers_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
