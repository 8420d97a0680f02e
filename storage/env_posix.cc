// The real file system behind Env: open/write/fsync/rename/pread on POSIX (Linux).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "storage/env.h"

namespace tessera::storage {
namespace {

// Small appends are gathered up to this size; larger ones go straight to write(2).
constexpr size_t kWriteBufferSize = 1 << 20;

// Writes all n bytes, retrying on EINTR and partial writes; returns 0 or an errno.
int WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t r = ::write(fd, data, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;  // write(2) never returns 0 for n > 0; do not spin if it does
    data += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override { (void)Close(); }

  Status Append(const void* data, size_t n) override {
    if (fd_ < 0) return Internal("append to closed file " + path_, {{"file", path_}});
    RETURN_IF_ERROR(error_);
    if (n == 0) return Status::Ok();
    const char* p = static_cast<const char*>(data);
    size_ += n;
    if (n <= kWriteBufferSize - used_) {
      // Fits in the buffer: one memcpy, no system call.
      if (buffer_ == nullptr) buffer_ = std::make_unique<char[]>(kWriteBufferSize);
      std::memcpy(buffer_.get() + used_, p, n);
      used_ += n;
      return Status::Ok();
    }
    RETURN_IF_ERROR(Flush());
    if (n >= kWriteBufferSize) return Write(p, n);  // big buffers skip the copy entirely
    if (buffer_ == nullptr) buffer_ = std::make_unique<char[]>(kWriteBufferSize);
    std::memcpy(buffer_.get(), p, n);
    used_ = n;
    return Status::Ok();
  }

  bool CanWriteAt() const override { return true; }
  Status WriteAt(uint64_t offset, const void* data, size_t n) override {
    if (fd_ < 0) return Internal("write to closed file " + path_, {{"file", path_}});
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "write", path_);
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (fd_ < 0) return Internal("sync of closed file " + path_, {{"file", path_}});
    RETURN_IF_ERROR(Flush());
    if (::fsync(fd_) != 0) {
      // After a failed fsync the page cache state is unknown; never report a later sync as ok.
      error_ = ErrnoStatus(errno, "fsync", path_);
      return error_;
    }
    return Status::Ok();
  }

  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    Status s = Flush();
    if (::close(fd_) != 0 && s.ok()) s = ErrnoStatus(errno, "close", path_);
    fd_ = -1;
    buffer_.reset();
    return s;
  }

  uint64_t Size() const override { return size_; }

 private:
  Status Flush() {
    RETURN_IF_ERROR(error_);
    if (used_ == 0) return Status::Ok();
    const size_t n = used_;
    used_ = 0;
    return Write(buffer_.get(), n);
  }

  Status Write(const char* data, size_t n) {
    if (const int err = WriteAll(fd_, data, n); err != 0) {
      // The file now has an unknown tail; later appends would land at the wrong offset.
      error_ = ErrnoStatus(err, "write", path_);
      return error_;
    }
    return Status::Ok();
  }

  int fd_;
  std::string path_;
  std::unique_ptr<char[]> buffer_;
  size_t used_ = 0;
  uint64_t size_ = 0;
  Status error_;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, std::string path, uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Status Read(uint64_t offset, size_t n, void* buf) const override {
    char* out = static_cast<char*>(buf);
    size_t done = 0;
    constexpr uint64_t kMaxOffset = std::numeric_limits<off_t>::max();
    while (done < n) {
      if (offset > kMaxOffset - done) break;  // beyond any possible file end: a short read
      const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "pread", path_).WithDetail("offset", offset);
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    if (done < n) {
      return DataLoss("short read of " + path_ + " at offset " + std::to_string(offset) +
                          ": wanted " + std::to_string(n) + " bytes, got " + std::to_string(done),
                      {{"file", path_}, {"offset", offset}, {"wanted", n}, {"got", done}});
    }
    return Status::Ok();
  }

  uint64_t Size() const override {
    struct stat st;
    // The file may have grown since open; fall back to the size seen at open.
    if (::fstat(fd_, &st) == 0) return static_cast<uint64_t>(st.st_size);
    return size_;
  }

 private:
  int fd_;
  std::string path_;
  uint64_t size_;
};

// Strips trailing slashes so "a/b/" and "a/b" are handled alike (keeps "/").
std::string StripTrailingSlashes(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// rename(2) that refuses to replace `to`; returns 0 or an errno.
int RenameNoReplace(const char* from, const char* to) {
#ifdef SYS_renameat2
  if (::syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != ENOSYS && errno != EINVAL) return errno;
#endif
  // No kernel or file-system support for RENAME_NOREPLACE: emulate it.
  struct stat st;
  if (::lstat(from, &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) {
    // link(2) fails with EEXIST atomically, so files get a race-free check.
    if (::link(from, to) == 0) {
      if (::unlink(from) == 0) return 0;
      const int err = errno;
      ::unlink(to);
      return err;
    }
    if (errno == EEXIST) return EEXIST;
  }
  // Directories (and file systems without hard links): check, then rename; racy but best effort.
  if (::lstat(to, &st) == 0) return EEXIST;
  if (errno != ENOENT) return errno;
  return ::rename(from, to) == 0 ? 0 : errno;
}

Status RemoveRecursively(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoStatus(errno, "stat", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "unlink", path);
    return Status::Ok();
  }
  std::vector<std::string> names;
  {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      if (errno == ENOENT) return Status::Ok();
      return ErrnoStatus(errno, "opendir", path);
    }
    // Names are collected first so only one DIR handle is open at any depth.
    while (true) {
      errno = 0;
      const dirent* e = ::readdir(dir);
      if (e == nullptr) break;
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) return ErrnoStatus(err, "readdir", path);
  }
  for (const std::string& name : names) RETURN_IF_ERROR(RemoveRecursively(JoinPath(path, name)));
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "rmdir", path);
  return Status::Ok();
}

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "create", path);
    return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(fd, path));
  }

  Result<std::unique_ptr<MappedFile>> MapFile(const std::string& path) override {
    return MappedFile::Open(path);
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "stat", path);
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return ErrnoStatus(EISDIR, "open", path);
    }
    return std::unique_ptr<RandomAccessFile>(
        std::make_unique<PosixRandomAccessFile>(fd, path, static_cast<uint64_t>(st.st_size)));
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(errno, "opendir", dir);
    std::vector<std::string> names;
    while (true) {
      errno = 0;
      const dirent* e = ::readdir(d);
      if (e == nullptr) break;
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return ErrnoStatus(err, "readdir", dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDirs(const std::string& dir) override {
    const std::string path = StripTrailingSlashes(dir);
    if (path.empty()) return Status::Ok();
    if (::mkdir(path.c_str(), 0755) == 0) return Status::Ok();
    int err = errno;
    if (err == ENOENT) {
      // Parents first, then retry; the common case (parent exists) costs one mkdir.
      const std::string parent = ParentDir(path);
      if (parent == path) return ErrnoStatus(err, "mkdir", path);
      RETURN_IF_ERROR(CreateDirs(parent));
      if (::mkdir(path.c_str(), 0755) == 0) return Status::Ok();
      err = errno;
    }
    if (err == EEXIST) {
      if (IsDirectory(path)) return Status::Ok();
      return ErrnoStatus(EEXIST, "mkdir", path);
    }
    return ErrnoStatus(err, "mkdir", path);
  }

  Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, "unlink", path);
    return Status::Ok();
  }

  Status DeleteTree(const std::string& dir) override { return RemoveRecursively(dir); }

  Status Rename(const std::string& from, const std::string& to) override {
    if (const int err = RenameNoReplace(from.c_str(), to.c_str()); err != 0) {
      return ErrnoStatus(err, "rename " + from + " to", to).WithDetail("from", from);
    }
    return Status::Ok();
  }

  Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open", dir);
    Status s;
    // EINVAL: the file system cannot fsync directories (their metadata is not ours to flush).
    if (::fsync(fd) != 0 && errno != EINVAL) s = ErrnoStatus(errno, "fsync", dir);
    ::close(fd);
    return s;
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
    if (S_ISDIR(st.st_mode)) return ErrnoStatus(EISDIR, "stat", path);
    return static_cast<uint64_t>(st.st_size);
  }
};

}  // namespace

std::unique_ptr<Env> NewPosixEnv() { return std::make_unique<PosixEnv>(); }

}  // namespace tessera::storage
