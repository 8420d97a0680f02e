// Owned storage for one message. Unlike std::vector it is not zero-filled when it
// grows (a received message overwrites it whole) and it keeps its capacity when it
// shrinks, so a recycled buffer costs neither a memset nor fresh page faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

namespace tessera::collectives {

// memcpy that accepts n == 0 with null pointers (empty vectors and buffers).
inline void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t size) { Reset(size); }
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;

  // Makes the buffer `size` bytes long. The contents are unspecified afterwards;
  // memory is reallocated only when the capacity is too small.
  void Reset(size_t size) {
    if (size > capacity_) {
      data_.reset(new uint8_t[size]);
      capacity_ = size;
    }
    size_ = size;
  }

  // 16-byte aligned (operator new[]), so any element type can be read in place.
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  std::span<const uint8_t> bytes() const { return {data_.get(), size_}; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace tessera::collectives
