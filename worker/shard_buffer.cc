#include "worker/shard_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

namespace tessera::worker {
namespace {

// From this size on, heap buffers are their own mapping with huge pages advised.
constexpr size_t kHugePageThreshold = size_t{2} << 20;

// What data() points at for zero-byte buffers: never read or written.
uint8_t empty_byte;

Status OutOfMemory(size_t bytes) {
  return ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes for a shard",
                           {{"bytes", bytes}});
}

}  // namespace

Result<std::unique_ptr<ShardBuffer>> ShardBuffer::NewHeap(size_t bytes) {
  if (bytes == 0) {
    return std::unique_ptr<ShardBuffer>(new ShardBuffer(Kind::kEmpty, &empty_byte, 0, ""));
  }
  if (bytes < kHugePageThreshold) {
    void* p = std::malloc(bytes);
    if (p == nullptr) return OutOfMemory(bytes);
    return std::unique_ptr<ShardBuffer>(
        new ShardBuffer(Kind::kMalloc, static_cast<uint8_t*>(p), bytes, ""));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return OutOfMemory(bytes);
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // advice only: fine where THP is off
  return std::unique_ptr<ShardBuffer>(
      new ShardBuffer(Kind::kAnonymousMap, static_cast<uint8_t*>(p), bytes, ""));
}

Result<std::shared_ptr<ShardBuffer>> ShardBuffer::Heap(size_t bytes) {
  ASSIGN_OR_RETURN(auto buffer, NewHeap(bytes));
  return std::shared_ptr<ShardBuffer>(std::move(buffer));
}

Result<std::shared_ptr<ShardBuffer>> ShardBuffer::Shm(const std::string& dir,
                                                      const std::string& file_name, size_t bytes) {
  const std::string path = dir + "/" + file_name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, "create shared-memory file", path);
  auto fail = [&](int err, std::string_view what) {
    close(fd);
    unlink(path.c_str());
    return ErrnoStatus(err, what, path);
  };
  // The umask may have taken bits away; the trainer (same user) needs read and write.
  if (fchmod(fd, 0600) != 0) return fail(errno, "chmod shared-memory file");
  void* p = &empty_byte;
  if (bytes > 0) {
    if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      return fail(err, "reserve " + std::to_string(bytes) + " bytes in shared-memory file");
    }
    // Populated now: every snapshot copies through this mapping, the first one too.
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) return fail(errno, "map shared-memory file");
  }
  close(fd);  // the mapping keeps the file; its path lets the trainer open it
  return std::shared_ptr<ShardBuffer>(
      new ShardBuffer(Kind::kFileMap, static_cast<uint8_t*>(p), bytes, path));
}

ShardBuffer::~ShardBuffer() {
  switch (kind_) {
    case Kind::kEmpty:
      break;
    case Kind::kMalloc:
      std::free(data_);
      break;
    case Kind::kAnonymousMap:
      munmap(data_, size_);
      break;
    case Kind::kFileMap:
      if (size_ > 0) munmap(data_, size_);
      unlink(path_.c_str());
      break;
  }
}

std::shared_ptr<ShardBufferPool> ShardBufferPool::Create(size_t max_bytes) {
  return std::shared_ptr<ShardBufferPool>(new ShardBufferPool(max_bytes));
}

Result<std::shared_ptr<ShardBuffer>> ShardBufferPool::Acquire(size_t bytes) {
  std::unique_ptr<ShardBuffer> buffer;
  {
    MutexLock lock(mu_);
    if (auto it = by_size_.find(bytes); it != by_size_.end()) {
      buffer = std::move(*it->second);
      lru_.erase(it->second);
      by_size_.erase(it);
      stats_.pooled_bytes -= bytes;
      ++stats_.reused;
    }
  }
  if (buffer == nullptr) {
    ASSIGN_OR_RETURN(buffer, ShardBuffer::NewHeap(bytes));
    MutexLock lock(mu_);
    ++stats_.allocated;
  }
  std::weak_ptr<ShardBufferPool> pool = weak_from_this();
  return std::shared_ptr<ShardBuffer>(buffer.release(), [pool](ShardBuffer* raw) {
    std::unique_ptr<ShardBuffer> owned(raw);
    if (auto p = pool.lock()) p->Release(std::move(owned));
  });
}

Status ShardBufferPool::Reserve(size_t bytes) {
  if (bytes == 0 || bytes > max_bytes_) return Status::Ok();
  ASSIGN_OR_RETURN(std::unique_ptr<ShardBuffer> buffer, ShardBuffer::NewHeap(bytes));
  // Every byte written, not one per page: on virtual machines a page touched
  // once still makes the first full copy into it about twice as slow.
  std::memset(buffer->data(), 0, bytes);
  {
    MutexLock lock(mu_);
    ++stats_.reserved;
  }
  Release(std::move(buffer));
  return Status::Ok();
}

void ShardBufferPool::Release(std::unique_ptr<ShardBuffer> buffer) {
  const size_t bytes = buffer->size();
  if (bytes > max_bytes_) return;
  std::vector<std::unique_ptr<ShardBuffer>> evicted;  // freed after the lock is dropped
  MutexLock lock(mu_);
  lru_.push_back(std::move(buffer));
  by_size_.emplace(bytes, std::prev(lru_.end()));
  stats_.pooled_bytes += bytes;
  EvictBeyond(max_bytes_, &evicted);
}

void ShardBufferPool::Trim(size_t bytes) {
  std::vector<std::unique_ptr<ShardBuffer>> evicted;  // freed after the lock is dropped
  MutexLock lock(mu_);
  EvictBeyond(bytes, &evicted);
}

void ShardBufferPool::EvictBeyond(size_t bytes, std::vector<std::unique_ptr<ShardBuffer>>* evicted) {
  while (stats_.pooled_bytes > bytes) {
    const size_t size = lru_.front()->size();
    auto [lo, hi] = by_size_.equal_range(size);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == lru_.begin()) {
        by_size_.erase(it);
        break;
      }
    }
    evicted->push_back(std::move(lru_.front()));
    lru_.pop_front();
    stats_.pooled_bytes -= size;
  }
}

ShardBufferPool::Stats ShardBufferPool::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

int RemoveOrphanedShmFiles(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("tessera-", 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + 8, nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      if (std::filesystem::remove(e.path(), ec)) ++removed;
    }
  }
  return removed;
}

}  // namespace tessera::worker
