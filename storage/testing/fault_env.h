// FaultEnv wraps another Env and injects failures, for fault loops in the
// style of SQLite's tests: "fail the Nth mutating I/O", for N = 1, 2, ...
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "api/thread_annotations.h"
#include "storage/env.h"

namespace tessera::storage {

class FaultEnv : public EnvWrapper {
 public:
  enum class Op { kCreate, kWrite, kSync, kRename, kSyncDir, kDelete, kMkdir };
  enum class Kind {
    kIoError,    // EIO → internal
    kNoSpace,    // ENOSPC → resource_exhausted
  };

  // `base` must outlive this Env.
  explicit FaultEnv(Env* base);

  // The Nth (1-based) mutating operation from now on fails with `kind`, and so
  // does every later one while `sticky` (a dead disk); 0 disables. Mutating
  // operations: file creation, Append, Sync, Rename, SyncDir, deletions, mkdir.
  void FailAt(uint64_t n, Kind kind = Kind::kIoError, bool sticky = false);
  // Every Append fails with ENOSPC once `bytes` in total have been appended.
  void FailAfterBytes(uint64_t bytes);
  void Reset();
  // Called with every mutating operation before it reaches the base Env (and before the
  // fault choice), on the thread that makes it: an interleaving test pauses one
  // operation at one of its steps here while another runs. Null: none. Reset keeps it.
  using Hook = std::function<void(Op op, const std::string& path)>;
  void SetHook(Hook hook) EXCLUDES(hook_mu_);
  // Mutating operations seen since construction or Reset().
  uint64_t ops() const { return ops_.load(); }
  // True once an injected failure has fired.
  bool fired() const { return fired_.load(); }

  // The mutating operations, counted (reads are EnvWrapper's, untouched).
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Status CreateDirs(const std::string& dir) override;
  Status DeleteFile(const std::string& path) override;
  Status DeleteTree(const std::string& dir) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  Status PublishFile(const std::string& path, std::string_view data) override;
  // Counted like the Env's own operations (create, append, sync, delete).
  Status BeforeChange(FileChange change, const std::string& path, uint64_t bytes) override;

  // Counts one mutating operation on `path`; returns the injected error, if any.
  // Public so wrapped file objects can call it.
  Status Tick(Op op, const std::string& path, uint64_t bytes = 0);

 private:
  std::atomic<uint64_t> ops_{0};
  std::atomic<uint64_t> fail_at_{0};
  std::atomic<bool> sticky_{false};
  std::atomic<int> kind_{0};
  std::atomic<bool> fired_{false};
  std::atomic<uint64_t> byte_limit_{0};
  std::atomic<uint64_t> bytes_{0};
  Mutex hook_mu_;  // for the pointer alone: the hook runs outside it
  std::shared_ptr<const Hook> hook_ GUARDED_BY(hook_mu_);
};

}  // namespace tessera::storage
