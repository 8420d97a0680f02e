// Copying between slices of one tensor, each stored row-major: the basis of
// read assembly, resharding and host-local ↔ global conversion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "api/shape.h"

namespace tessera::storage {

// Calls fn(src_byte, dst_byte, bytes) for each contiguous run of the overlap of
// `src` and `dst`, in ascending order of both offsets. Trailing dimensions that
// both hold whole are merged, so runs are as long as possible.
void ForEachRun(const SliceSpec& src, const SliceSpec& dst, size_t elem_size,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& fn);

// Copies the overlap of `src` (bytes at src_data) into `dst` (bytes at dst_data).
void CopyOverlap(const SliceSpec& src, const void* src_data, const SliceSpec& dst, void* dst_data,
                 size_t elem_size);

}  // namespace tessera::storage
