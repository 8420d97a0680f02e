// DefaultEnv: one Env for every path a process meets. "s3://" paths go to the
// object store, the rest to the file system; the object store is set up on
// first use, so processes that never see an s3:// path never need its settings.
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "storage/env.h"
#include "storage/s3/s3_env.h"

namespace tessera::storage {
namespace {

class RoutingEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return For(path)->NewWritableFile(path);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    return For(path)->NewRandomAccessFile(path);
  }
  bool Exists(const std::string& path) override { return For(path)->Exists(path); }
  bool IsDirectory(const std::string& path) override { return For(path)->IsDirectory(path); }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return For(dir)->ListDir(dir);
  }
  Status CreateDirs(const std::string& dir) override { return For(dir)->CreateDirs(dir); }
  Status DeleteFile(const std::string& path) override { return For(path)->DeleteFile(path); }
  Status DeleteTree(const std::string& dir) override { return For(dir)->DeleteTree(dir); }
  Status Rename(const std::string& from, const std::string& to) override {
    return For(IsS3Path(to) ? to : from)->Rename(from, to);
  }
  Status SyncDir(const std::string& dir) override { return For(dir)->SyncDir(dir); }
  Result<uint64_t> FileSize(const std::string& path) override { return For(path)->FileSize(path); }
  bool IsObjectStore(const std::string& path) override { return For(path)->IsObjectStore(path); }
  Result<std::unique_ptr<MappedFile>> MapFile(const std::string& path) override {
    return For(path)->MapFile(path);
  }
  Status PublishFile(const std::string& path, std::string_view data) override {
    return For(path)->PublishFile(path, data);
  }

 private:
  Env* For(const std::string& path) {
    if (!IsS3Path(path)) return posix_.get();
    std::call_once(s3_once_, [this] {
      S3EnvOptions options;
      // Tuning knobs (MiB per part, parts in flight per file, upload threads).
      if (const char* v = std::getenv("TESSERA_S3_PART_MB")) {
        options.part_bytes = std::strtoull(v, nullptr, 10) << 20;
      }
      if (const char* v = std::getenv("TESSERA_S3_PARTS_IN_FLIGHT")) options.parts_in_flight = std::atoi(v);
      if (const char* v = std::getenv("TESSERA_S3_THREADS")) options.upload_threads = std::atoi(v);
      // How long one request may keep retrying (5xx, SlowDown, resets) before failing.
      if (const char* v = std::getenv("TESSERA_S3_RETRY_MS")) options.retry_budget_ms = std::atoll(v);
      s3_ = NewS3Env(options);
    });
    return s3_.get();
  }

  std::unique_ptr<Env> posix_ = NewPosixEnv();
  std::once_flag s3_once_;
  std::unique_ptr<Env> s3_;
};

}  // namespace

Env* DefaultEnv() {
  // Leaked on purpose: callers may use it from static destructors.
  static Env* const env = new RoutingEnv();
  return env;
}

}  // namespace tessera::storage
