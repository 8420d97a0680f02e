// The checkpoint index reader (storage/index.h) and the readers behind it:
// verify and the read planner, over a committed checkpoint whose index.sqlite
// is replaced by the input.
//
// An input that starts with the SQLite header is the index file itself. Any
// other input is SQL, run against the checkpoint's own index (no attaching,
// bounded in steps and sizes), and the resulting database is the
// index: that reaches the rows, where flipped bytes mostly hit page structure.
// Properties checked:
//  - opening, verifying and reading give data_loss, invalid_argument or
//    not_found naming the culprit, never a crash, a hang or another code.
// The input is sealed with a valid checksum trailer before it is read, so the
// fuzzing reaches past the checksum to the pages and rows behind it.
#include <sqlite3.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz/checkpoint_inputs.h"
#include "storage/sqlite_db.h"

namespace tessera::storage {
namespace {

constexpr char kSqliteHeader[] = "SQLite format 3";  // 16 bytes with its NUL

// No files (ATTACH, and VACUUM INTO through it), and no printf: its width runs
// one call for as long as it asks, where the progress handler cannot stop it.
int Authorize(void*, int action, const char*, const char* arg2, const char*, const char*) {
  if (action == SQLITE_ATTACH || action == SQLITE_DETACH) return SQLITE_DENY;
  if (action == SQLITE_FUNCTION && arg2 != nullptr &&
      (sqlite3_stricmp(arg2, "printf") == 0 || sqlite3_stricmp(arg2, "format") == 0)) {
    return SQLITE_DENY;
  }
  return SQLITE_OK;
}

int Progress(void* steps) { return ++*static_cast<int*>(steps) > 2000; }  // × 1000 VM steps

// The pristine index with `sql` applied; empty when the SQL leaves no image.
std::string Edited(const std::string& original, std::string_view sql) {
  auto db = SqliteDb::FromImage(original, "index");
  FUZZ_CHECK(db.ok(), db.status().ToString());
  sqlite3* raw = db->raw();
  sqlite3_limit(raw, SQLITE_LIMIT_ATTACHED, 0);
  sqlite3_limit(raw, SQLITE_LIMIT_LENGTH, 1 << 20);
  sqlite3_limit(raw, SQLITE_LIMIT_SQL_LENGTH, 1 << 16);
  sqlite3_set_authorizer(raw, Authorize, nullptr);
  (void)db->Exec("PRAGMA max_page_count = 4096");
  int steps = 0;
  sqlite3_progress_handler(raw, 1000, Progress, &steps);
  (void)db->Exec(std::string(sql));  // a failing statement ends the script there
  sqlite3_progress_handler(raw, 0, nullptr, nullptr);
  auto image = db->Serialize();
  return image.ok() ? *image : std::string();
}

}  // namespace
}  // namespace tessera::storage

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::storage;
  static fuzz::SavedCheckpoint* ck = new fuzz::SavedCheckpoint();
  static const std::string original = [] {
    std::string file = ck->Read(kIndexFile);
    return file.substr(0, file.size() - kIndexSealBytes);  // the SQLite image
  }();
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string image;
  if (in.size() >= sizeof(kSqliteHeader) &&
      std::memcmp(in.data(), kSqliteHeader, sizeof(kSqliteHeader)) == 0) {
    image = std::string(in);
  } else {
    image = Edited(original, in);
  }
  // Sealed with its checksum, so that the rows and pages are what get read (a
  // changed byte of a sealed file is caught by the checksum: tests/unit/fault_test.cc).
  ck->Write(kIndexFile, SealIndexImage(image));
  fuzz::ReadEverything(&ck->env, ck->dir, {});
  return 0;
}
