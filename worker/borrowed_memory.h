// Memory of a trainer process on this host that the worker reads or writes in place
// (docs/jax.md, "Borrowed memory"): bytes the trainer keeps unchanged until a save has
// ended (a JAX array is immutable; the trainer pins it), read chunk by chunk with
// process_vm_readv as the shard writer writes them; or fresh buffers a restore writes
// into (process_vm_writev) and the trainer then hands to JAX. Calls only the kernel.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/status.h"

namespace tessera::worker {

// `bytes` bytes at `address` in process `pid`.
class BorrowedMemory {
 public:
  BorrowedMemory(pid_t pid, uint64_t address, size_t bytes, std::string tensor, int64_t device)
      : pid_(pid), address_(address), bytes_(bytes), tensor_(std::move(tensor)), device_(device) {}

  size_t size() const { return bytes_; }
  // Copies [offset, offset + n) into `dst`. An error names the tensor, the device and
  // the process (gone, or its memory no longer there).
  Status Read(uint64_t offset, size_t n, void* dst) const;
  // Copies `n` bytes from `src` into [offset, offset + n) (a restore into the trainer's
  // memory); errors as Read.
  Status Write(uint64_t offset, const void* src, size_t n) const;

 private:
  Status Move(uint64_t offset, size_t n, char* local, bool write) const;

  pid_t pid_;
  uint64_t address_;
  size_t bytes_;
  std::string tensor_;
  int64_t device_;
};

// ok when process `pid` is the caller's: it belongs to this worker's user and holds
// `token` (bytes the caller chose) at `token_address`, which a process of the same
// number in another PID namespace would not. conflict with "reason": "borrow_refused"
// naming why not (the caller then copies instead).
Status CheckLender(pid_t pid, uint64_t token_address, const std::string& token);
// ok when the first and last of `n` bytes at `address` are memory of `pid`;
// invalid_argument otherwise.
Status CheckLent(pid_t pid, uint64_t address, size_t n);

}  // namespace tessera::worker
