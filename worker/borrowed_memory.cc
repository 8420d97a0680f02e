#include "worker/borrowed_memory.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tessera::worker {
namespace {

// The real uid of process `pid` from /proc/<pid>/status, or -1.
int64_t ProcessUid(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      int64_t uid = -1;
      fields >> uid;
      return uid;
    }
  }
  return -1;
}

// Reads (or, `write`, writes) n bytes at `address` of `pid` from/into `local`; errno's
// text when it cannot.
Status MoveProcess(pid_t pid, uint64_t address, size_t n, char* local, bool write) {
  while (n > 0) {
    iovec here{local, n};
    iovec there{reinterpret_cast<void*>(address), n};
    const ssize_t got = write ? process_vm_writev(pid, &here, 1, &there, 1, 0)
                              : process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EFAULT;
      return Status(err == ESRCH ? Code::kUnavailable : Code::kInternal, std::strerror(err),
                    {{"errno", err}});
    }
    local += got;
    address += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

Status ReadProcess(pid_t pid, uint64_t address, size_t n, void* dst) {
  return MoveProcess(pid, address, n, static_cast<char*>(dst), false);
}

}  // namespace

Status BorrowedMemory::Move(uint64_t offset, size_t n, char* local, bool write) const {
  if (offset > bytes_ || n > bytes_ - offset) {
    return Internal("access to [" + std::to_string(offset) + ", +" + std::to_string(n) +
                    ") past the " + std::to_string(bytes_) + " borrowed bytes of tensor '" +
                    tensor_ + "'");
  }
  Status s = MoveProcess(pid_, address_ + offset, n, local, write);
  if (s.ok()) return s;
  return Status(s.code(),
                std::string(write ? "writing" : "reading") + " tensor '" + tensor_ + "' on device " +
                    std::to_string(device_) + (write ? " into" : " from") + " trainer process " +
                    std::to_string(pid_) + " failed (" + s.message() +
                    "): the process is gone or no longer holds the bytes it lent",
                {{"tensor", tensor_}, {"device", device_}, {"pid", static_cast<int64_t>(pid_)}});
}

Status BorrowedMemory::Read(uint64_t offset, size_t n, void* dst) const {
  return Move(offset, n, static_cast<char*>(dst), false);
}

Status BorrowedMemory::Write(uint64_t offset, const void* src, size_t n) const {
  // process_vm_writev reads the local side only.
  return Move(offset, n, const_cast<char*>(static_cast<const char*>(src)), true);
}

Status CheckLender(pid_t pid, uint64_t token_address, const std::string& token) {
  auto refused = [pid](const std::string& why) {
    return Conflict("this worker cannot use the memory of process " + std::to_string(pid) + ": " +
                        why,
                    {{"field", "pid"}, {"pid", static_cast<int64_t>(pid)}, {"reason", "borrow_refused"}});
  };
  if (pid <= 0) return refused("not a process id");
  const int64_t uid = ProcessUid(pid);
  if (uid < 0) return refused("no such process here (another PID namespace?)");
  if (uid != static_cast<int64_t>(getuid())) {
    return refused("it belongs to uid " + std::to_string(uid) + ", the worker runs as uid " +
                   std::to_string(getuid()));
  }
  if (token.empty() || token.size() > 64) return refused("the token must be 1..64 bytes");
  std::string seen(token.size(), '\0');
  Status s = ReadProcess(pid, token_address, seen.size(), seen.data());
  if (!s.ok()) return refused(s.message() + " (ptrace restrictions, or another PID namespace)");
  if (seen != token) {
    return refused("its memory at the token's address does not hold the token: it is not the "
                   "caller (another PID namespace?)");
  }
  return Status::Ok();
}

Status CheckLent(pid_t pid, uint64_t address, size_t n) {
  if (n == 0) return Status::Ok();
  char probe;
  for (uint64_t at : {address, address + n - 1}) {
    Status s = ReadProcess(pid, at, 1, &probe);
    if (!s.ok()) {
      return InvalidArgument("bytes [" + std::to_string(address) + ", +" + std::to_string(n) +
                                 ") are not memory of process " + std::to_string(pid) + " (" +
                                 s.message() + ")",
                             {{"field", "address"}, {"pid", static_cast<int64_t>(pid)}});
    }
  }
  return Status::Ok();
}

}  // namespace tessera::worker
