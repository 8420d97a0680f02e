// The float codec (docs/format.md, "Codec and checksum"): a chunk of w-byte floats
// (w = 2: bfloat16, float16; w = 4: float32) split into w byte planes, plane i holding
// byte i of every element, each plane stored as one zstd frame or raw, whichever is
// smaller. A float's high byte (its sign and most of its exponent) takes few values in
// a trained state and compresses; its mantissa bytes look random and stay raw, so zstd
// never spends time on them past a sample.
//
// Stored bytes: w u32 (little-endian) stored lengths, one per plane (equal to the
// plane's length: raw; less: a zstd frame), the planes in order, then the chunk's last
// (raw length mod w) bytes raw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api/status.h"

namespace tessera::storage {

// Encodes n bytes of w-byte elements (w 2 or 4) into `out` (at least n + 4 w bytes of
// room): the stored length, or 0 when the planes would not fit in `out`.
size_t EncodePlanes(const void* data, size_t n, int w, int level, char* out, size_t out_capacity);

// Decodes a planes chunk of w-byte elements into `out` (raw_length bytes); data_loss
// saying what does not fit.
Status DecodePlanes(std::string_view stored, uint64_t raw_length, int w, void* out);

// Byte i of every w-byte element of `src` (m elements) into planes[i] (m bytes each),
// and back.
void SplitPlanes(const uint8_t* src, size_t m, int w, uint8_t* const* planes);
void JoinPlanes(const uint8_t* const* planes, size_t m, int w, uint8_t* dst);

}  // namespace tessera::storage
