// Preemption notices per mesh and the sync point of docs/semantics.md
// "reached_preemption_sync_point": after a notice, every worker of the mesh
// reports the step it has reached; once all have, the sync step is
// max(reported) + 1, the same for everyone, and it never changes until the
// notice is cleared (by the restarted job).
//
// A notice is persisted as one document in the catalog's `kv` table under
// "~preemption/<mesh>": it is a handful of fields per mesh, the key is outside
// the public name alphabet (so KV users never see or collide with it), and no
// schema migration is needed. The document holds the reported steps and the
// decided sync step, so a restarted tesserad answers as before.
//
// A worker's report stays after its wait times out; a later report keeps the
// larger step. Since workers report every step, max + 1 is never behind any
// worker's current step.
//
// Thread-safe. The mutex guards memory alone; writers store first, one at a time
// (WriteTurns), then change memory, so waiters never queue behind the catalog.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"
#include "service/catalog.h"
#include "service/events.h"
#include "service/metrics.h"
#include "service/write_turns.h"

namespace tessera::service {

class Preemption {
 public:
  // `events` and `metrics` may be null (tests). REQUIRES: `catalog` outlives this object.
  Preemption(Catalog* catalog, EventBus* events, Metrics* metrics)
      : catalog_(catalog), events_(events), metrics_(metrics) {}

  // Loads the notices from the catalog. Call once, before the other methods.
  Status Load();

  // Records a notice for `mesh` (a second notice keeps the first) → State(mesh).
  Result<Json> Notice(const std::string& mesh, const std::string& reason);
  // {mesh, noticed, reason, noticed_at, sync_step, reported_steps:{worker: step}}.
  Json State(const std::string& mesh);
  // Forgets the notice (no-op without one); waiters get {noticed:false}.
  Status Clear(const std::string& mesh);

  // The sync-point call of worker `worker` at `step`; `workers` are the mesh's
  // workers. Without a notice → {noticed:false, sync_step:null} at once. Else
  // records the step and waits until every worker has reported (or the step is
  // decided already) → {noticed:true, sync_step, reached: step == sync_step}.
  // conflict naming the worker if it is not in `workers`; deadline_exceeded
  // with details.missing_workers after `timeout_ms`; unavailable after Shutdown().
  Result<Json> Sync(const std::string& mesh, const std::vector<std::string>& workers,
                    const std::string& worker, int64_t step, int64_t timeout_ms);

  int64_t noticed_count();
  // Wakes every waiter and refuses later waits.
  void Shutdown();

 private:
  struct Record {
    std::string reason;
    int64_t noticed_ms = 0;
    std::optional<int64_t> sync_step;
    std::map<std::string, int64_t> reported;  // worker → largest step reported
    uint64_t epoch = 0;                        // tells a waiter its notice was replaced
  };
  static std::string CatalogKey(const std::string& mesh);
  Json ToJson(const std::string& mesh, const Record* r) const;  // r null: no notice
  // Writes the record (null: deletes it) to the catalog; a failure is counted and named.
  Status Persist(const std::string& mesh, const Record* r);
  // Records `worker`'s step in a turn of its own: the answer when it is decided (or
  // there is nothing to wait for), null to wait, with the notice's `*epoch`.
  Result<Json> Report(const std::string& mesh, const std::vector<std::string>& workers,
                      const std::string& worker, int64_t step, uint64_t* epoch);
  void Publish(Json event);
  Result<Json> CountSync(Result<Json> outcome);

  Catalog* catalog_;
  EventBus* events_;
  Metrics* metrics_;
  WriteTurns turns_;  // writers, one at a time: the catalog, then memory
  Mutex mu_;  // memory alone, never held across a catalog write
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t next_epoch_ GUARDED_BY(mu_) = 1;
  std::map<std::string, Record> notices_ GUARDED_BY(mu_);  // by mesh
};

}  // namespace tessera::service
