// The coordination service of tesserad (docs/openapi.json "Coordination: barriers, KV,
// preemption"): named barriers, a persisted key-value store and per-mesh
// preemption notices with their sync point. This class takes the requests as
// they come (names, JSON bodies), validates them and hands them to the three
// parts (barriers.h, kv_store.h, preemption.h).
//
// Locking: each part has its own mutex and condition variable, so blocking
// calls never hold Service::mu_. Callers may hold Service::mu_ while calling
// the non-blocking methods; nothing here calls back into Service.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "api/clock.h"
#include "api/json_codec.h"
#include "api/status.h"
#include "service/barriers.h"
#include "service/catalog.h"
#include "service/events.h"
#include "service/kv_store.h"
#include "service/metrics.h"
#include "service/preemption.h"

namespace tessera::service {

struct CoordinationOptions {
  int64_t default_timeout_ms = 30000;  // barrier and sync waits without timeout_ms
  int64_t max_wait_ms = 60000;         // cap for every wait
  Clock* clock = RealClock();          // what barrier waits read (api/clock.h)
};

class Coordination {
 public:
  // Loads the KV store and the preemption notices from `catalog`. `events` and
  // `metrics` may be null. REQUIRES: all three outlive the Coordination.
  static Result<std::unique_ptr<Coordination>> Open(CoordinationOptions options, Catalog* catalog,
                                                    EventBus* events, Metrics* metrics);

  // POST /api/v1/barriers/{name} with {rank, world, timeout_ms?}: blocks until
  // all ranks arrived (see Barriers::Arrive).
  Result<Json> ArriveBarrier(const std::string& name, const Json& body);
  Json ListBarriers();

  // KV; keys obey the name rules (invalid_argument naming "key").
  Status PutValue(const std::string& key, std::string value);
  // wait_ms is clamped to [0, max_wait_ms].
  Result<std::string> GetValue(const std::string& key, int64_t wait_ms);
  // {"keys": [...]} sorted.
  Json ListKeys(const std::string& prefix);
  Status DeleteValue(const std::string& key);

  // Preemption of a mesh the caller has checked exists; `workers` are its workers.
  // Notice body: {reason?}. Sync body: {worker, step, timeout_ms?}.
  Result<Json> NoticePreemption(const std::string& mesh, const Json& body);
  Json PreemptionState(const std::string& mesh);
  Status ClearPreemption(const std::string& mesh);
  Result<Json> SyncPreemption(const std::string& mesh, const std::vector<std::string>& workers,
                              const Json& body);

  // {open_barriers, preemption_notices, kv_keys} for /api/v1/cluster and /metrics.
  Json Counts();

  // Wakes every waiter (they answer unavailable) and refuses later waits.
  void Shutdown();

 private:
  Coordination(CoordinationOptions options, Catalog* catalog, EventBus* events, Metrics* metrics);
  // timeout_ms of `body` (default if absent), clamped to max_wait_ms; < 0 is invalid.
  Result<int64_t> Timeout(const Json& body);

  CoordinationOptions options_;
  Barriers barriers_;
  KvStore kv_;
  Preemption preemption_;
};

}  // namespace tessera::service
