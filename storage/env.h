// Env: the file-system seam. Storage code never calls open(2) directly; it goes
// through an Env so tests can substitute an in-memory or fault-injecting one.
//
// Implementations: NewPosixEnv() (real files), NewMemEnv() (in memory, with a
// crash simulation), FaultEnv (wraps another Env and fails chosen operations).
// All Envs are thread-safe; individual file objects are not (REQUIRES: external
// synchronization per file object).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/status.h"
#include "storage/mapped_file.h"

namespace tessera::storage {

// A file opened for appending. Data is durable only after Sync() returns ok.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(const void* data, size_t n) = 0;
  // Flushes written data to stable storage (fsync).
  virtual Status Sync() = 0;
  // Releases the file. Does not imply Sync(). Idempotent.
  virtual Status Close() = 0;
  // Bytes appended so far.
  virtual uint64_t Size() const = 0;
  // Whether WriteAt works: writes at known offsets, safe from several threads at once,
  // so that one file is filled in parallel. A file written so is never appended to.
  // Default: no (an object store's upload only appends).
  virtual bool CanWriteAt() const { return false; }
  virtual Status WriteAt(uint64_t offset, const void* data, size_t n) {
    (void)offset, (void)data, (void)n;
    return InvalidArgument("this file can only be appended to");
  }
};

// A file opened for positional reads (pread). Safe for concurrent Read calls.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly n bytes at offset into buf; a short file is data_loss naming the file.
  virtual Status Read(uint64_t offset, size_t n, void* buf) const = 0;
  virtual uint64_t Size() const = 0;
};

// A change to a file that a library writes in place (SQLite's own files), announced to
// the Env before it happens: see Env::BeforeChange.
enum class FileChange { kCreate, kWrite, kSync, kDelete };

class Env {
 public:
  virtual ~Env() = default;

  // Creates (truncating) a file for writing.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) = 0;

  virtual bool Exists(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Names (not paths) of the entries of dir, sorted.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Creates dir and missing parents; ok if it exists.
  virtual Status CreateDirs(const std::string& dir) = 0;
  virtual Status DeleteFile(const std::string& path) = 0;
  // Removes a directory and everything below it; ok if it does not exist.
  virtual Status DeleteTree(const std::string& dir) = 0;
  // Atomically renames a file or directory. Fails (conflict) if `to` exists.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // fsync of a directory: makes its entries (creations, renames) durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;

  // True where `path` lives in an object store (s3://): no directories and no
  // rename, so checkpoints there commit by publishing a manifest (checkpoint_dir.h).
  virtual bool IsObjectStore(const std::string& path) {
    (void)path;
    return false;
  }
  // The file mapped read-only into memory, to read it without a copy (an import's
  // tensors, an export's raw chunks). Default: invalid_argument (an object store, or an
  // Env in memory, cannot map): callers then read through NewRandomAccessFile.
  virtual Result<std::unique_ptr<MappedFile>> MapFile(const std::string& path);
  // Creates `path` holding `data`, durably and atomically, and only if nothing has
  // that name yet: conflict otherwise. Default: a synced temporary file renamed
  // into place (Rename never replaces).
  virtual Status PublishFile(const std::string& path, std::string_view data);

  // Called before a change to a file that is not written through this Env's file
  // objects: the databases SQLite keeps in place (sqlite_vfs.h), such as tesserad's
  // catalog. An error refuses the change. Default: ok.
  virtual Status BeforeChange(FileChange change, const std::string& path, uint64_t bytes) {
    (void)change, (void)path, (void)bytes;
    return Status::Ok();
  }
};

// An Env that forwards every call to another (LevelDB's idiom): a wrapper overrides
// only what it changes. `target` must outlive it.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    return target_->NewRandomAccessFile(path);
  }
  bool Exists(const std::string& path) override { return target_->Exists(path); }
  bool IsDirectory(const std::string& path) override { return target_->IsDirectory(path); }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return target_->ListDir(dir);
  }
  Status CreateDirs(const std::string& dir) override { return target_->CreateDirs(dir); }
  Status DeleteFile(const std::string& path) override { return target_->DeleteFile(path); }
  Status DeleteTree(const std::string& dir) override { return target_->DeleteTree(dir); }
  Status Rename(const std::string& from, const std::string& to) override {
    return target_->Rename(from, to);
  }
  Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  Result<uint64_t> FileSize(const std::string& path) override { return target_->FileSize(path); }
  bool IsObjectStore(const std::string& path) override { return target_->IsObjectStore(path); }
  Result<std::unique_ptr<MappedFile>> MapFile(const std::string& path) override {
    return target_->MapFile(path);
  }
  Status PublishFile(const std::string& path, std::string_view data) override {
    return target_->PublishFile(path, data);
  }
  Status BeforeChange(FileChange change, const std::string& path, uint64_t bytes) override {
    return target_->BeforeChange(change, path, bytes);
  }

 private:
  Env* target_;
};

// The real file system. Never null; owned by the caller.
std::unique_ptr<Env> NewPosixEnv();

// Process-wide env for callers that do not inject one: "s3://bucket/key" paths
// go to the S3 object store (storage/s3/s3_env.h), every other path to POSIX.
Env* DefaultEnv();

// Whole-file helpers built on any Env.
Status WriteFileDurably(Env* env, const std::string& path, std::string_view data);
Result<std::string> ReadWholeFile(Env* env, const std::string& path);

// Path helpers ("a/b" + "c" → "a/b/c"; parent of "a/b/c" is "a/b").
std::string JoinPath(std::string_view a, std::string_view b);
std::string ParentDir(std::string_view path);

}  // namespace tessera::storage
