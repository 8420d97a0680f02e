#include "storage/sqlite_vfs.h"

#include <sqlite3.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "api/thread_annotations.h"

namespace tessera::storage {
namespace {

// Our file: the Env and the path, followed in memory by the default VFS's own file.
struct EnvFile {
  sqlite3_file base;  // first: SQLite sees an EnvFile as a sqlite3_file
  Env* env;
  const char* path;   // SQLite keeps the name alive while the file is open
  sqlite3_file* real;
};

sqlite3_vfs* Default() { return sqlite3_vfs_find(nullptr); }
sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<EnvFile*>(f)->real; }

// Asks the Env about a change; an error it gives becomes SQLite's code for it.
int Check(Env* env, FileChange change, const char* path, uint64_t bytes, int io_error) {
  if (env == nullptr || path == nullptr) return SQLITE_OK;
  Status st = env->BeforeChange(change, path, bytes);
  if (st.ok()) return SQLITE_OK;
  return st.code() == Code::kResourceExhausted ? SQLITE_FULL : io_error;
}

int Close(sqlite3_file* f) {
  int rc = Real(f)->pMethods != nullptr ? Real(f)->pMethods->xClose(Real(f)) : SQLITE_OK;
  return rc;
}
int Read(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
  return Real(f)->pMethods->xRead(Real(f), buf, n, off);
}
int Write(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  auto* ef = reinterpret_cast<EnvFile*>(f);
  if (int rc = Check(ef->env, FileChange::kWrite, ef->path, static_cast<uint64_t>(n),
                     SQLITE_IOERR_WRITE);
      rc != SQLITE_OK) {
    return rc;
  }
  return Real(f)->pMethods->xWrite(Real(f), buf, n, off);
}
int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  auto* ef = reinterpret_cast<EnvFile*>(f);
  if (int rc = Check(ef->env, FileChange::kWrite, ef->path, 0, SQLITE_IOERR_TRUNCATE);
      rc != SQLITE_OK) {
    return rc;
  }
  return Real(f)->pMethods->xTruncate(Real(f), size);
}
int Sync(sqlite3_file* f, int flags) {
  auto* ef = reinterpret_cast<EnvFile*>(f);
  if (int rc = Check(ef->env, FileChange::kSync, ef->path, 0, SQLITE_IOERR_FSYNC);
      rc != SQLITE_OK) {
    return rc;
  }
  return Real(f)->pMethods->xSync(Real(f), flags);
}
int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  return Real(f)->pMethods->xFileSize(Real(f), size);
}
int Lock(sqlite3_file* f, int level) { return Real(f)->pMethods->xLock(Real(f), level); }
int Unlock(sqlite3_file* f, int level) { return Real(f)->pMethods->xUnlock(Real(f), level); }
int CheckReservedLock(sqlite3_file* f, int* out) {
  return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
}
int FileControl(sqlite3_file* f, int op, void* arg) {
  return Real(f)->pMethods->xFileControl(Real(f), op, arg);
}
int SectorSize(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int DeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
int ShmMap(sqlite3_file* f, int region, int size, int extend, void volatile** out) {
  return Real(f)->pMethods->xShmMap(Real(f), region, size, extend, out);
}
int ShmLock(sqlite3_file* f, int offset, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}
void ShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int ShmUnmap(sqlite3_file* f, int delete_flag) {
  return Real(f)->pMethods->xShmUnmap(Real(f), delete_flag);
}
// No memory-mapped reads: every page goes through Read (and writes through Write).
int Fetch(sqlite3_file*, sqlite3_int64, int, void** out) {
  *out = nullptr;
  return SQLITE_OK;
}
int Unfetch(sqlite3_file*, sqlite3_int64, void*) { return SQLITE_OK; }

const sqlite3_io_methods kMethods = {
    3,         Close,     Read,     Write,       Truncate,   Sync,
    FileSize,  Lock,      Unlock,   CheckReservedLock,       FileControl,
    SectorSize, DeviceCharacteristics, ShmMap,   ShmLock,    ShmBarrier,
    ShmUnmap,  Fetch,     Unfetch,
};

Env* EnvOf(sqlite3_vfs* vfs) { return static_cast<Env*>(vfs->pAppData); }

int Open(sqlite3_vfs* vfs, const char* name, sqlite3_file* f, int flags, int* out_flags) {
  auto* ef = reinterpret_cast<EnvFile*>(f);
  ef->base.pMethods = nullptr;
  ef->env = EnvOf(vfs);
  ef->path = name;
  ef->real = reinterpret_cast<sqlite3_file*>(ef + 1);
  if (name != nullptr && (flags & SQLITE_OPEN_CREATE) && !ef->env->Exists(name)) {
    if (int rc = Check(ef->env, FileChange::kCreate, name, 0, SQLITE_CANTOPEN); rc != SQLITE_OK) {
      return rc;
    }
  }
  int rc = Default()->xOpen(Default(), name, ef->real, flags, out_flags);
  if (rc == SQLITE_OK) ef->base.pMethods = &kMethods;
  return rc;
}
int Delete(sqlite3_vfs* vfs, const char* name, int sync_dir) {
  if (int rc = Check(EnvOf(vfs), FileChange::kDelete, name, 0, SQLITE_IOERR_DELETE);
      rc != SQLITE_OK) {
    return rc;
  }
  return Default()->xDelete(Default(), name, sync_dir);
}
int Access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return Default()->xAccess(Default(), name, flags, out);
}
int FullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return Default()->xFullPathname(Default(), name, n, out);
}
void* DlOpen(sqlite3_vfs*, const char* name) { return Default()->xDlOpen(Default(), name); }
void DlError(sqlite3_vfs*, int n, char* out) { Default()->xDlError(Default(), n, out); }
void (*DlSym(sqlite3_vfs*, void* handle, const char* symbol))(void) {
  return Default()->xDlSym(Default(), handle, symbol);
}
void DlClose(sqlite3_vfs*, void* handle) { Default()->xDlClose(Default(), handle); }
int Randomness(sqlite3_vfs*, int n, char* out) { return Default()->xRandomness(Default(), n, out); }
int Sleep(sqlite3_vfs*, int us) { return Default()->xSleep(Default(), us); }
int CurrentTime(sqlite3_vfs*, double* out) { return Default()->xCurrentTime(Default(), out); }
int GetLastError(sqlite3_vfs*, int n, char* out) {
  return Default()->xGetLastError(Default(), n, out);
}
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* out) {
  return Default()->xCurrentTimeInt64(Default(), out);
}

struct Registry {
  Mutex mu;
  // By Env; never removed: SQLite may hold a VFS until its last database closes.
  std::map<Env*, std::unique_ptr<std::pair<sqlite3_vfs, std::string>>> vfs GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: databases may close after statics
  return *r;
}

}  // namespace

Result<std::string> EnvVfsName(Env* env) {
  Registry& r = TheRegistry();
  MutexLock lock(r.mu);
  auto it = r.vfs.find(env);
  if (it != r.vfs.end()) return it->second->second;
  sqlite3_vfs* base = Default();
  if (base == nullptr) return Internal("SQLite has no default VFS");
  auto entry = std::make_unique<std::pair<sqlite3_vfs, std::string>>();
  entry->second = "tessera-env-" + std::to_string(reinterpret_cast<uintptr_t>(env));
  sqlite3_vfs& v = entry->first;
  std::memset(&v, 0, sizeof(v));
  v.iVersion = 2;
  v.szOsFile = static_cast<int>(sizeof(EnvFile)) + base->szOsFile;
  v.mxPathname = base->mxPathname;
  v.zName = entry->second.c_str();
  v.pAppData = env;
  v.xOpen = Open;
  v.xDelete = Delete;
  v.xAccess = Access;
  v.xFullPathname = FullPathname;
  v.xDlOpen = DlOpen;
  v.xDlError = DlError;
  v.xDlSym = DlSym;
  v.xDlClose = DlClose;
  v.xRandomness = Randomness;
  v.xSleep = Sleep;
  v.xCurrentTime = CurrentTime;
  v.xGetLastError = GetLastError;
  v.xCurrentTimeInt64 = CurrentTimeInt64;
  if (int rc = sqlite3_vfs_register(&v, 0); rc != SQLITE_OK) {
    return Internal(std::string("cannot register a SQLite VFS: ") + sqlite3_errstr(rc));
  }
  std::string name = entry->second;
  r.vfs.emplace(env, std::move(entry));
  return name;
}

}  // namespace tessera::storage
