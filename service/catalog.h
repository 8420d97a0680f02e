// The catalog: tesserad's durable state in SQLite (WAL). Every record is a JSON
// document under its key, so the in-memory model and the file never disagree
// about fields; the schema version (PRAGMA user_version) drives migrations.
//
//   workers(id)  meshes(name)  checkpoints(mesh, step)  jobs(id)  retention(mesh)  kv(key)
#pragma once

#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"
#include "storage/sqlite_db.h"

namespace tessera::service {

inline constexpr int kCatalogSchemaVersion = 1;

class Catalog {
 public:
  // Opens (creating and migrating) <data_dir>/catalog.sqlite. Every change to its
  // files goes past `env` first (Env::BeforeChange), like every other file's.
  static Result<std::unique_ptr<Catalog>> Open(storage::Env* env, const std::string& data_dir);

  // Upserts / deletes one document. `table` is one of the tables above.
  Status Put(const std::string& table, const std::string& key, const Json& doc);
  Status Delete(const std::string& table, const std::string& key);
  // Every document of a table, in insertion order.
  Result<std::vector<Json>> All(const std::string& table);

 private:
  explicit Catalog(storage::SqliteDb db) : db_(std::move(db)) {}
  Mutex mu_;
  storage::SqliteDb db_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
