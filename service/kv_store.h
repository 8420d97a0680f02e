// The coordination service's key-value store (docs/openapi.json "Coordination"): small
// values (≤ 1 MiB) under names, which jobs use to exchange addresses, flags and
// configuration. Values are arbitrary bytes, written through to the catalog's
// `kv` table (base64 inside the JSON document) and held in memory for reads;
// a reader may wait for a key to appear.
//
// Thread-safe. The mutex guards memory alone and is never held across a catalog write:
// writers go one at a time (WriteTurns), each storing before it changes the map, so a
// reader never sees a value that was not stored and never waits for the disk.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "service/catalog.h"
#include "service/metrics.h"
#include "service/write_turns.h"

namespace tessera::service {

inline constexpr size_t kMaxKvValueBytes = 1 << 20;

// Catalog `kv` keys starting with this are tesserad's own records (preemption
// notices): the character is outside the name alphabet, so no user key has it.
inline constexpr char kInternalKvPrefix[] = "~";

class KvStore {
 public:
  // `metrics` may be null (tests). REQUIRES: `catalog` outlives this object.
  KvStore(Catalog* catalog, Metrics* metrics) : catalog_(catalog), metrics_(metrics) {}

  // Loads every user key from the catalog. Call once, before the other methods.
  Status Load();

  // Stores `value` under `key` (durable when this returns ok); wakes waiting Gets.
  // payload_too_large naming the key above kMaxKvValueBytes.
  // REQUIRES (this and below): `key` is a valid name.
  Status Put(const std::string& key, std::string value);
  // The value, waiting up to `wait_ms` for the key to appear; not_found naming
  // the key after that; unavailable if Shutdown() ends the wait.
  Result<std::string> Get(const std::string& key, int64_t wait_ms);
  // Keys starting with `prefix`, sorted.
  std::vector<std::string> Keys(const std::string& prefix);
  // not_found naming the key if it is absent.
  Status Delete(const std::string& key);
  int64_t size();
  // Gets waiting for their key now.
  int64_t waiting();

  // Wakes every waiter and refuses later waits.
  void Shutdown();

 private:
  void CountOp(const char* op, const Status& outcome);

  Catalog* catalog_;
  Metrics* metrics_;
  WriteTurns turns_;  // Put and Delete, one at a time: the catalog and the map agree
  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> values_ GUARDED_BY(mu_);
  int64_t waiting_ GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::service
