// The catalog: tesserad's durable state in SQLite (WAL). Every record is a JSON
// document under its key, so the in-memory model and the file never disagree
// about fields; the schema version (PRAGMA user_version) drives migrations.
//
//   workers(id)  meshes(name)  checkpoints(mesh, step)  jobs(id)  retention(mesh)  kv(key)
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"
#include "storage/sqlite_db.h"

namespace tessera::service {

inline constexpr int kCatalogSchemaVersion = 2;

// One row's change: the document to upsert, or none to delete the row.
struct CatalogChange {
  std::string table;
  std::string key;
  std::optional<Json> doc;
};

class Catalog {
 public:
  // Opens (creating and migrating) <data_dir>/catalog.sqlite. Every change to its
  // files goes past `env` first (Env::BeforeChange), like every other file's.
  static Result<std::unique_ptr<Catalog>> Open(storage::Env* env, const std::string& data_dir);

  // Upserts / deletes one document. `table` is one of the tables above. Each is
  // O(log n): `seq` (insertion order) is indexed, and its next value is kept here.
  Status Put(const std::string& table, const std::string& key, const Json& doc);
  // Many rows in one transaction: all or none.
  Status PutMany(const std::string& table, const std::vector<std::pair<std::string, Json>>& rows);
  Status Delete(const std::string& table, const std::string& key);
  // Deletes many documents of one table in one transaction.
  Status DeleteMany(const std::string& table, const std::vector<std::string>& keys);
  // Changes over any tables in one transaction: all or none.
  Status Apply(const std::vector<CatalogChange>& changes);
  // Every document of a table, in insertion order.
  Result<std::vector<Json>> All(const std::string& table);
  // The number of documents in a table.
  Result<int64_t> Count(const std::string& table);

 private:
  explicit Catalog(storage::SqliteDb db) : db_(std::move(db)) {}
  Status DeleteRows(const std::string& table, const std::vector<std::string>& keys) REQUIRES(mu_);
  Status PutRows(const std::string& table, const std::vector<std::pair<std::string, Json>>& rows)
      REQUIRES(mu_);
  Mutex mu_;
  storage::SqliteDb db_ GUARDED_BY(mu_);
  std::map<std::string, int64_t> last_seq_ GUARDED_BY(mu_);  // by table
};

}  // namespace tessera::service
