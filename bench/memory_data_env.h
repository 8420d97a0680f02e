// The in-process agents' Env when the benchmark measures the control plane apart from
// the disk: their shard files live in memory (storage::MemEnv), and their directories
// are made on disk too, where tesserad merges and commits the save (its index and
// summary, its rename). So 1,024 agents' fsyncs on 2 vCPUs do not hide what tesserad
// costs; a checkpoint saved this way cannot be restored.
#pragma once

#include <memory>
#include <string>

#include "storage/env.h"
#include "storage/testing/mem_env.h"

namespace tessera::bench {

class MemoryDataEnv : public storage::EnvWrapper {
 public:
  MemoryDataEnv() : storage::EnvWrapper(storage::DefaultEnv()) {}

  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& path) override {
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos) (void)mem_.CreateDirs(path.substr(0, slash));
    return mem_.NewWritableFile(path);
  }
  Result<std::unique_ptr<storage::RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    return mem_.NewRandomAccessFile(path);
  }
  Result<uint64_t> FileSize(const std::string& path) override { return mem_.FileSize(path); }
  Status DeleteFile(const std::string& path) override {
    (void)target()->DeleteFile(path);
    return mem_.DeleteFile(path);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (mem_.Exists(from)) return mem_.Rename(from, to);
    return target()->Rename(from, to);
  }
  bool Exists(const std::string& path) override { return mem_.Exists(path) || target()->Exists(path); }

 private:
  storage::MemEnv mem_;
};

}  // namespace tessera::bench
