// A small RAII layer over SQLite: databases live in memory and travel as
// serialized images written through the Env, so every index byte goes through
// the same file-system seam (and fault injection) as shard data.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

class SqliteStmt {
 public:
  SqliteStmt() = default;
  SqliteStmt(sqlite3_stmt* stmt, sqlite3* db) : stmt_(stmt), db_(db) {}
  SqliteStmt(SqliteStmt&& o) noexcept : stmt_(o.stmt_), db_(o.db_) { o.stmt_ = nullptr; }
  SqliteStmt& operator=(SqliteStmt&& o) noexcept;
  ~SqliteStmt();

  SqliteStmt& Bind(int index, int64_t v);
  SqliteStmt& Bind(int index, std::string_view v);
  SqliteStmt& BindNull(int index);
  // Steps once: true if a row is available, false when done.
  Result<bool> Step();
  // Steps to completion (for statements without rows), then resets.
  Status Run();
  void Reset();

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) const;
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  sqlite3* db_ = nullptr;
};

class SqliteDb {
 public:
  // An empty in-memory database.
  static Result<SqliteDb> OpenMemory();
  // An in-memory database from a serialized image; `label` (the file name)
  // appears in errors. A non-database image is data_loss.
  static Result<SqliteDb> FromImage(std::string_view image, const std::string& label);
  // A database file on disk (for catalogs that SQLite manages itself), changed in
  // place through `env`'s VFS (sqlite_vfs.h) when one is given.
  static Result<SqliteDb> OpenFile(const std::string& path, Env* env = nullptr);

  SqliteDb(SqliteDb&& o) noexcept : db_(o.db_), label_(std::move(o.label_)) { o.db_ = nullptr; }
  SqliteDb& operator=(SqliteDb&& o) noexcept;
  ~SqliteDb();

  Status Exec(const std::string& sql);
  Result<SqliteStmt> Prepare(const std::string& sql);
  // The main schema as a serialized image.
  Result<std::string> Serialize();
  // Attaches an image as schema `name` (e.g. for INSERT ... SELECT merges).
  Status AttachImage(const std::string& name, std::string_view image, const std::string& label);
  Status Detach(const std::string& name);
  // An error status for the last failure, naming `label_`.
  Status Error(std::string_view what) const;
  sqlite3* raw() { return db_; }

 private:
  SqliteDb(sqlite3* db, std::string label) : db_(db), label_(std::move(label)) {}
  sqlite3* db_ = nullptr;
  std::string label_;
};

}  // namespace tessera::storage
