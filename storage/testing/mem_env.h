// In-memory Env for tests, modelling what survives a crash.
//
// Durability model (the one POSIX gives): file contents are durable up to the
// last successful Sync(); a directory entry (a creation, deletion or rename) is
// durable once SyncDir() of its parent returned ok. SimulateCrash() throws away
// everything that was not durable, as a power loss would.
#pragma once

#include <memory>

#include "storage/env.h"

namespace tessera::storage {

class MemEnv : public Env {
 public:
  MemEnv();
  ~MemEnv() override;

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  bool Exists(const std::string& path) override;
  bool IsDirectory(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Status CreateDirs(const std::string& dir) override;
  Status DeleteFile(const std::string& path) override;
  Status DeleteTree(const std::string& dir) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  Result<uint64_t> FileSize(const std::string& path) override;

  // Reverts to the durable state: unsynced file bytes and unsynced directory
  // entries are lost. Open file handles become stale (their writes go nowhere).
  void SimulateCrash();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera::storage
