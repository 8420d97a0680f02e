// FaultEnv: counts mutating operations and fails the chosen ones before they reach the base Env.
#include "storage/testing/fault_env.h"

#include <cerrno>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::storage {
namespace {

// byte_limit_ value meaning "no byte budget", so FailAfterBytes(0) can mean "no room at all".
constexpr uint64_t kNoByteLimit = std::numeric_limits<uint64_t>::max();

std::string_view OpName(FaultEnv::Op op) {
  switch (op) {
    case FaultEnv::Op::kCreate:
      return "create";
    case FaultEnv::Op::kWrite:
      return "append";
    case FaultEnv::Op::kSync:
      return "sync";
    case FaultEnv::Op::kRename:
      return "rename";
    case FaultEnv::Op::kSyncDir:
      return "syncdir";
    case FaultEnv::Op::kDelete:
      return "delete";
    case FaultEnv::Op::kMkdir:
      return "mkdir";
  }
  return "io";
}

// Forwards to the base file once the FaultEnv let the operation through.
class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultEnv* env, std::unique_ptr<WritableFile> base, std::string path)
      : env_(env), base_(std::move(base)), path_(std::move(path)) {}

  Status Append(const void* data, size_t n) override {
    RETURN_IF_ERROR(env_->Tick(FaultEnv::Op::kWrite, path_, n));
    return base_->Append(data, n);
  }

  Status Sync() override {
    RETURN_IF_ERROR(env_->Tick(FaultEnv::Op::kSync, path_));
    return base_->Sync();
  }

  Status Close() override { return base_->Close(); }
  uint64_t Size() const override { return base_->Size(); }

 private:
  FaultEnv* env_;
  std::unique_ptr<WritableFile> base_;
  std::string path_;
};

}  // namespace

FaultEnv::FaultEnv(Env* base) : EnvWrapper(base), byte_limit_(kNoByteLimit) {}

void FaultEnv::FailAt(uint64_t n, Kind kind, bool sticky) {
  kind_ = static_cast<int>(kind);
  sticky_ = sticky;
  fired_ = false;
  // "From now on": relative to the operations already counted.
  fail_at_ = n == 0 ? 0 : ops_.load() + n;
}

void FaultEnv::FailAfterBytes(uint64_t bytes) {
  bytes_ = 0;
  byte_limit_ = bytes;
}

void FaultEnv::Reset() {
  fail_at_ = 0;
  sticky_ = false;
  kind_ = static_cast<int>(Kind::kIoError);
  fired_ = false;
  byte_limit_ = kNoByteLimit;
  bytes_ = 0;
  ops_ = 0;
}

void FaultEnv::SetHook(Hook hook) {
  MutexLock lock(hook_mu_);
  hook_ = hook ? std::make_shared<const Hook>(std::move(hook)) : nullptr;
}

Status FaultEnv::Tick(Op op, const std::string& path, uint64_t bytes) {
  std::shared_ptr<const Hook> hook;
  {
    MutexLock lock(hook_mu_);
    hook = hook_;
  }
  if (hook) (*hook)(op, path);
  const uint64_t n = ++ops_;
  const uint64_t fail_at = fail_at_.load();
  if (fail_at != 0 && (n == fail_at || (n > fail_at && sticky_.load()))) {
    fired_ = true;
    const int err = static_cast<Kind>(kind_.load()) == Kind::kNoSpace ? ENOSPC : EIO;
    return ErrnoStatus(err, OpName(op), path).WithDetail("injected", true);
  }
  if (op == Op::kWrite) {
    const uint64_t limit = byte_limit_.load();
    // Attempted bytes keep counting, so once over budget every later Append fails too.
    if (limit != kNoByteLimit && bytes_.fetch_add(bytes) + bytes > limit) {
      fired_ = true;
      return ErrnoStatus(ENOSPC, OpName(op), path).WithDetail("injected", true);
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<WritableFile>> FaultEnv::NewWritableFile(const std::string& path) {
  RETURN_IF_ERROR(Tick(Op::kCreate, path));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, target()->NewWritableFile(path));
  return std::unique_ptr<WritableFile>(
      std::make_unique<FaultWritableFile>(this, std::move(file), path));
}

Status FaultEnv::CreateDirs(const std::string& dir) {
  RETURN_IF_ERROR(Tick(Op::kMkdir, dir));
  return target()->CreateDirs(dir);
}

Status FaultEnv::DeleteFile(const std::string& path) {
  RETURN_IF_ERROR(Tick(Op::kDelete, path));
  return target()->DeleteFile(path);
}

Status FaultEnv::DeleteTree(const std::string& dir) {
  RETURN_IF_ERROR(Tick(Op::kDelete, dir));
  return target()->DeleteTree(dir);
}

Status FaultEnv::Rename(const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(Tick(Op::kRename, from));
  return target()->Rename(from, to);
}

Status FaultEnv::SyncDir(const std::string& dir) {
  RETURN_IF_ERROR(Tick(Op::kSyncDir, dir));
  return target()->SyncDir(dir);
}

Status FaultEnv::PublishFile(const std::string& path, std::string_view data) {
  // On a file system the default (write, sync, rename) passes each step through
  // this Env's faults; an object store publishes in one request, one operation.
  if (!target()->IsObjectStore(path)) return Env::PublishFile(path, data);
  RETURN_IF_ERROR(Tick(Op::kCreate, path, data.size()));
  return target()->PublishFile(path, data);
}

Status FaultEnv::BeforeChange(FileChange change, const std::string& path, uint64_t bytes) {
  Op op = Op::kWrite;
  switch (change) {
    case FileChange::kCreate:
      op = Op::kCreate;
      break;
    case FileChange::kWrite:
      op = Op::kWrite;
      break;
    case FileChange::kSync:
      op = Op::kSync;
      break;
    case FileChange::kDelete:
      op = Op::kDelete;
      break;
  }
  RETURN_IF_ERROR(Tick(op, path, bytes));
  return target()->BeforeChange(change, path, bytes);
}

}  // namespace tessera::storage
