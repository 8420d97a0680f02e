#include "storage/sqlite_db.h"

#include <cstring>

#include "storage/sqlite_vfs.h"

namespace tessera::storage {

SqliteStmt& SqliteStmt::operator=(SqliteStmt&& o) noexcept {
  if (this != &o) {
    if (stmt_) sqlite3_finalize(stmt_);
    stmt_ = o.stmt_;
    db_ = o.db_;
    o.stmt_ = nullptr;
  }
  return *this;
}

SqliteStmt::~SqliteStmt() {
  if (stmt_) sqlite3_finalize(stmt_);
}

SqliteStmt& SqliteStmt::Bind(int index, int64_t v) {
  sqlite3_bind_int64(stmt_, index, v);
  return *this;
}

SqliteStmt& SqliteStmt::Bind(int index, std::string_view v) {
  sqlite3_bind_text64(stmt_, index, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  return *this;
}

SqliteStmt& SqliteStmt::BindNull(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}

Result<bool> SqliteStmt::Step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  int code = sqlite3_extended_errcode(db_);
  std::string msg = std::string("sqlite: ") + sqlite3_errmsg(db_);
  if ((code & 0xff) == SQLITE_CORRUPT || (code & 0xff) == SQLITE_NOTADB) return DataLoss(msg);
  if ((code & 0xff) == SQLITE_CONSTRAINT) return Conflict(msg);
  if ((code & 0xff) == SQLITE_FULL) return ResourceExhausted(msg);
  return Internal(msg);
}

Status SqliteStmt::Run() {
  while (true) {
    ASSIGN_OR_RETURN(bool row, Step());
    if (!row) break;
  }
  Reset();
  return Status::Ok();
}

void SqliteStmt::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

std::string SqliteStmt::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
           : std::string();
}

Result<SqliteDb> SqliteDb::OpenMemory() {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(":memory:", &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    sqlite3_close(db);
    return Internal("sqlite: cannot open an in-memory database");
  }
  return SqliteDb(db, ":memory:");
}

Result<SqliteDb> SqliteDb::OpenFile(const std::string& path, Env* env) {
  std::string vfs;
  if (env != nullptr) {
    ASSIGN_OR_RETURN(vfs, EnvVfsName(env));
  }
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                           vfs.empty() ? nullptr : vfs.c_str());
  SqliteDb out(db, path);
  if (rc != SQLITE_OK) return out.Error("open");
  sqlite3_busy_timeout(db, 5000);
  return out;
}

namespace {

// Copies `image` into SQLite-owned memory and deserializes it into `schema`.
int Deserialize(sqlite3* db, const char* schema, std::string_view image) {
  auto* buf = static_cast<unsigned char*>(sqlite3_malloc64(image.size() ? image.size() : 1));
  if (!buf) return SQLITE_NOMEM;
  std::memcpy(buf, image.data(), image.size());
  return sqlite3_deserialize(db, schema, buf, image.size(), image.size(),
                             SQLITE_DESERIALIZE_FREEONCLOSE | SQLITE_DESERIALIZE_RESIZEABLE);
}

}  // namespace

Result<SqliteDb> SqliteDb::FromImage(std::string_view image, const std::string& label) {
  ASSIGN_OR_RETURN(SqliteDb db, OpenMemory());
  db.label_ = label;
  if (Deserialize(db.db_, "main", image) != SQLITE_OK) return db.Error("load");
  // Deserialize accepts any bytes; touching the schema is what detects garbage.
  Status st = db.Exec("SELECT count(*) FROM sqlite_master");
  if (!st.ok()) {
    return DataLoss(label + " is not a valid SQLite database: " + st.message(), {{"file", label}});
  }
  return db;
}

SqliteDb& SqliteDb::operator=(SqliteDb&& o) noexcept {
  if (this != &o) {
    if (db_) sqlite3_close(db_);
    db_ = o.db_;
    label_ = std::move(o.label_);
    o.db_ = nullptr;
  }
  return *this;
}

SqliteDb::~SqliteDb() {
  if (db_) sqlite3_close(db_);
}

Status SqliteDb::Error(std::string_view what) const {
  int code = db_ ? sqlite3_extended_errcode(db_) & 0xff : SQLITE_CANTOPEN;
  std::string msg = "sqlite " + std::string(what) + " on " + label_ + ": " +
                    (db_ ? sqlite3_errmsg(db_) : "cannot open");
  nlohmann::json details = {{"file", label_}};
  if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) return DataLoss(msg, details);
  if (code == SQLITE_FULL) return ResourceExhausted(msg, details);
  return Internal(msg, details);
}

Status SqliteDb::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    sqlite3_free(err);
    return Error("exec");
  }
  return Status::Ok();
}

Result<SqliteStmt> SqliteDb::Prepare(const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  return SqliteStmt(stmt, db_);
}

Result<std::string> SqliteDb::Serialize() {
  sqlite3_int64 size = 0;
  unsigned char* data = sqlite3_serialize(db_, "main", &size, 0);
  if (!data) return Error("serialize");
  std::string out(reinterpret_cast<char*>(data), size);
  sqlite3_free(data);
  return out;
}

Status SqliteDb::AttachImage(const std::string& name, std::string_view image,
                             const std::string& label) {
  RETURN_IF_ERROR(Exec("ATTACH DATABASE ':memory:' AS " + name));
  if (Deserialize(db_, name.c_str(), image) != SQLITE_OK) {
    (void)Detach(name);
    return DataLoss("cannot load " + label + " as a SQLite database", {{"file", label}});
  }
  Status st = Exec("SELECT count(*) FROM " + name + ".sqlite_master");
  if (!st.ok()) {
    (void)Detach(name);
    return DataLoss(label + " is not a valid SQLite database", {{"file", label}});
  }
  return Status::Ok();
}

Status SqliteDb::Detach(const std::string& name) { return Exec("DETACH DATABASE " + name); }

}  // namespace tessera::storage
