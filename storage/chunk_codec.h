// Encoding of one chunk: a zstd frame, the float codec's byte planes
// (float_planes.h), or the raw bytes when compression does not pay. The checksum is
// xxh64 of the raw (uncompressed) bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "api/dtype.h"
#include "api/status.h"

namespace tessera::storage {

// kPlanes2, kPlanes4: byte planes of 2- and 4-byte floats, each plane zstd or raw.
enum class Codec : uint32_t { kRaw = 0, kZstd = 1, kPlanes2 = 2, kPlanes4 = 3 };

// Whether `value` is a codec this build reads.
bool IsCodec(uint64_t value);
// The element width the float codec splits `dtype` by: 4 (float32), 2 (bfloat16,
// float16), or 0 (not a float it codes).
int PlaneWidth(DType dtype);

std::string_view CodecName(Codec codec);
Result<Codec> ParseCodec(std::string_view name);

// xxh64 (seed 0) of data.
uint64_t Checksum(const void* data, size_t n);

struct EncodedChunk {
  Codec codec = Codec::kRaw;  // kRaw: the stored bytes are the source itself
  uint64_t length = 0;        // stored bytes (in `out` for kZstd)
  uint64_t raw_length = 0;
  uint64_t checksum = 0;      // of the raw bytes
};

// Capacity EncodeChunk needs in `out` for n raw bytes.
size_t MaxEncodedSize(size_t n);

// Compresses `data` at zstd `level` into `out` (when `compress`): as byte planes of
// `width`-byte floats (PlaneWidth; 0: plain zstd), and keeps the result only if it
// saves at least `min_savings` of the bytes (and at least 1/64); always checksums.
// `out` is caller-owned and reused across chunks: no allocation per chunk.
// REQUIRES: out_capacity >= MaxEncodedSize(n) when compress.
EncodedChunk EncodeChunk(const void* data, size_t n, bool compress, int level, char* out,
                         size_t out_capacity, double min_savings = 0, int width = 0);
// The same for a chunk whose checksum the caller computed already.
EncodedChunk EncodeSummedChunk(const void* data, size_t n, uint64_t checksum, bool compress,
                               int level, char* out, size_t out_capacity, double min_savings,
                               int width);

// Decodes `stored` into `out` (exactly raw_length bytes) and verifies the checksum.
// Errors are data_loss; the caller adds which tensor/file/offset.
Status DecodeChunk(Codec codec, std::string_view stored, uint64_t raw_length,
                   uint64_t checksum, void* out);

}  // namespace tessera::storage
