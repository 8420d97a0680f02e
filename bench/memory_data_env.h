// The in-process agents' Env when the benchmark measures the control plane apart from
// the disk: their shard files are written to the page cache and never synced (no
// fsync, no directory sync), so 1,024 agents' fsyncs on 2 vCPUs do not hide what
// tesserad costs. tesserad merges and commits on disk as usual (and checks that the
// files the joins name are there); a checkpoint saved this way is not durable.
#pragma once

#include <memory>
#include <string>

#include "storage/env.h"

namespace tessera::bench {

class MemoryDataEnv : public storage::EnvWrapper {
 public:
  MemoryDataEnv() : storage::EnvWrapper(storage::DefaultEnv()) {}

  Result<std::unique_ptr<storage::WritableFile>> NewWritableFile(const std::string& path) override {
    ASSIGN_OR_RETURN(auto file, target()->NewWritableFile(path));
    return std::unique_ptr<storage::WritableFile>(new Unsynced(std::move(file)));
  }
  Status SyncDir(const std::string&) override { return Status::Ok(); }

 private:
  // A file whose Sync does nothing.
  class Unsynced : public storage::WritableFile {
   public:
    explicit Unsynced(std::unique_ptr<storage::WritableFile> f) : f_(std::move(f)) {}
    Status Append(const void* data, size_t n) override { return f_->Append(data, n); }
    Status Sync() override { return Status::Ok(); }
    Status Close() override { return f_->Close(); }
    uint64_t Size() const override { return f_->Size(); }
    bool CanWriteAt() const override { return f_->CanWriteAt(); }
    Status WriteAt(uint64_t offset, const void* data, size_t n) override {
      return f_->WriteAt(offset, data, n);
    }

   private:
    std::unique_ptr<storage::WritableFile> f_;
  };
};

}  // namespace tessera::bench
