#include "service/catalog.h"

#include "storage/env.h"

namespace tessera::service {
namespace {

constexpr const char* kTables[] = {"workers", "meshes", "checkpoints", "jobs", "retention", "kv"};

// Migration i brings the schema from version i to i + 1.
const std::vector<std::string> kMigrations = {
    R"sql(
CREATE TABLE workers(key TEXT PRIMARY KEY, seq INTEGER, doc TEXT NOT NULL);
CREATE TABLE meshes(key TEXT PRIMARY KEY, seq INTEGER, doc TEXT NOT NULL);
CREATE TABLE checkpoints(key TEXT PRIMARY KEY, seq INTEGER, doc TEXT NOT NULL);
CREATE TABLE jobs(key TEXT PRIMARY KEY, seq INTEGER, doc TEXT NOT NULL);
CREATE TABLE retention(key TEXT PRIMARY KEY, seq INTEGER, doc TEXT NOT NULL);
CREATE TABLE kv(key TEXT PRIMARY KEY, seq INTEGER, doc TEXT NOT NULL);
)sql",
    R"sql(
CREATE INDEX workers_seq ON workers(seq);
CREATE INDEX meshes_seq ON meshes(seq);
CREATE INDEX checkpoints_seq ON checkpoints(seq);
CREATE INDEX jobs_seq ON jobs(seq);
CREATE INDEX retention_seq ON retention(seq);
CREATE INDEX kv_seq ON kv(seq);
)sql",
};

bool KnownTable(const std::string& t) {
  for (const char* k : kTables) {
    if (t == k) return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<Catalog>> Catalog::Open(storage::Env* env, const std::string& data_dir) {
  RETURN_IF_ERROR(env->CreateDirs(data_dir));
  ASSIGN_OR_RETURN(auto db,
                   storage::SqliteDb::OpenFile(storage::JoinPath(data_dir, "catalog.sqlite"), env));
  RETURN_IF_ERROR(db.Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"));
  ASSIGN_OR_RETURN(auto stmt, db.Prepare("PRAGMA user_version"));
  RETURN_IF_ERROR(stmt.Step().status());
  int64_t version = stmt.Int(0);
  stmt = storage::SqliteStmt();
  if (version > kCatalogSchemaVersion) {
    return InvalidArgument("catalog schema version " + std::to_string(version) +
                           " is newer than this tesserad (" +
                           std::to_string(kCatalogSchemaVersion) + ")");
  }
  for (int64_t v = version; v < kCatalogSchemaVersion; ++v) {
    RETURN_IF_ERROR(db.Exec("BEGIN; " + kMigrations[v] + " PRAGMA user_version = " +
                            std::to_string(v + 1) + "; COMMIT;"));
  }
  std::unique_ptr<Catalog> catalog(new Catalog(std::move(db)));
  MutexLock lock(catalog->mu_);
  for (const char* table : kTables) {
    ASSIGN_OR_RETURN(auto last,
                     catalog->db_.Prepare(std::string("SELECT MAX(seq) FROM ") + table));
    RETURN_IF_ERROR(last.Step().status());
    catalog->last_seq_[table] = last.Int(0);
  }
  return catalog;
}

Status Catalog::Put(const std::string& table, const std::string& key, const Json& doc) {
  if (!KnownTable(table)) return Internal("unknown catalog table " + table);
  MutexLock lock(mu_);
  return PutRows(table, {{key, doc}});
}

Status Catalog::PutMany(const std::string& table,
                        const std::vector<std::pair<std::string, Json>>& rows) {
  std::vector<CatalogChange> changes;
  changes.reserve(rows.size());
  for (const auto& [key, doc] : rows) changes.push_back({table, key, doc});
  return Apply(changes);
}

// An update keeps its row's seq; the number it did not use is simply skipped.
Status Catalog::PutRows(const std::string& table,
                        const std::vector<std::pair<std::string, Json>>& rows) {
  ASSIGN_OR_RETURN(auto stmt, db_.Prepare("INSERT INTO " + table +
                                          "(key, seq, doc) VALUES(?1, ?3, ?2) "
                                          "ON CONFLICT(key) DO UPDATE SET doc = excluded.doc"));
  for (const auto& [key, doc] : rows) {
    RETURN_IF_ERROR(stmt.Bind(1, key).Bind(2, doc.dump()).Bind(3, ++last_seq_[table]).Run());
  }
  return Status::Ok();
}

Status Catalog::Delete(const std::string& table, const std::string& key) {
  if (!KnownTable(table)) return Internal("unknown catalog table " + table);
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(auto stmt, db_.Prepare("DELETE FROM " + table + " WHERE key = ?1"));
  return stmt.Bind(1, key).Run();
}

Status Catalog::DeleteMany(const std::string& table, const std::vector<std::string>& keys) {
  std::vector<CatalogChange> changes;
  changes.reserve(keys.size());
  for (const std::string& key : keys) changes.push_back({table, key, std::nullopt});
  return Apply(changes);
}

Status Catalog::DeleteRows(const std::string& table, const std::vector<std::string>& keys) {
  ASSIGN_OR_RETURN(auto stmt, db_.Prepare("DELETE FROM " + table + " WHERE key = ?1"));
  for (const std::string& key : keys) RETURN_IF_ERROR(stmt.Bind(1, key).Run());
  return Status::Ok();
}

Status Catalog::Apply(const std::vector<CatalogChange>& changes) {
  for (const CatalogChange& c : changes) {
    if (!KnownTable(c.table)) return Internal("unknown catalog table " + c.table);
  }
  if (changes.empty()) return Status::Ok();
  MutexLock lock(mu_);
  RETURN_IF_ERROR(db_.Exec("BEGIN"));
  Status st;
  // Runs of one table and kind share a prepared statement.
  for (size_t i = 0; i < changes.size() && st.ok();) {
    const CatalogChange& first = changes[i];
    std::vector<std::pair<std::string, Json>> puts;
    std::vector<std::string> deletes;
    for (; i < changes.size() && changes[i].table == first.table &&
           changes[i].doc.has_value() == first.doc.has_value();
         ++i) {
      if (first.doc) {
        puts.emplace_back(changes[i].key, *changes[i].doc);
      } else {
        deletes.push_back(changes[i].key);
      }
    }
    st = first.doc ? PutRows(first.table, puts) : DeleteRows(first.table, deletes);
  }
  if (st.ok()) st = db_.Exec("COMMIT");
  if (!st.ok()) (void)db_.Exec("ROLLBACK");
  return st;
}

Result<int64_t> Catalog::Count(const std::string& table) {
  if (!KnownTable(table)) return Internal("unknown catalog table " + table);
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(auto stmt, db_.Prepare("SELECT COUNT(*) FROM " + table));
  RETURN_IF_ERROR(stmt.Step().status());
  return stmt.Int(0);
}

Result<std::vector<Json>> Catalog::All(const std::string& table) {
  if (!KnownTable(table)) return Internal("unknown catalog table " + table);
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(auto stmt, db_.Prepare("SELECT doc FROM " + table + " ORDER BY seq"));
  std::vector<Json> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    auto j = ParseJson(stmt.Text(0), "catalog " + table);
    if (!j.ok()) return DataLoss("catalog table " + table + " holds a corrupt document");
    out.push_back(std::move(*j));
  }
  return out;
}

}  // namespace tessera::service
