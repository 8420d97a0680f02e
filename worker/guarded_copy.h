// Copies through memory that a trainer may shrink under the worker: a shared-memory
// file (ShardBuffer::Shm) that the trainer truncates turns a read or write of its
// vanished pages into SIGBUS. These copies answer false then, and the process lives.
// Owns the process's SIGBUS disposition (installed on first use; a SIGBUS outside a
// guarded copy goes to what was there before).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::worker {

// The XXH3-64 of `n` bytes, vectorised for the CPU at hand (the same value on any).
uint64_t Checksum64(const void* data, size_t n);

// Copies `n` bytes from `src` to `dst`: false when either faulted with SIGBUS (then
// part of them was copied). With `checksum`, it receives the Checksum64 of the bytes
// as written, taken in the same pass (each block hashed while it is in cache).
bool GuardedCopy(uint8_t* dst, const uint8_t* src, size_t n, uint64_t* checksum = nullptr);

// The Checksum64 of `n` bytes that may vanish the same way: false when they did.
bool GuardedChecksum(const uint8_t* data, size_t n, uint64_t* checksum);

// The Checksum64 of bytes given in parts, in order (the same value as one call over
// them all).
class Checksum64Stream {
 public:
  Checksum64Stream();
  ~Checksum64Stream();
  Checksum64Stream(const Checksum64Stream&) = delete;
  Checksum64Stream& operator=(const Checksum64Stream&) = delete;
  void Update(const void* data, size_t n);
  uint64_t Digest() const;

 private:
  void* state_;  // an XXH3_state_t
};

// Whether the `n` bytes at `a` and at `b` are the same (*equal), read the same
// guarded way: false when either vanished. Stops at the first difference.
bool GuardedEqual(const uint8_t* a, const uint8_t* b, size_t n, bool* equal);

}  // namespace tessera::worker
