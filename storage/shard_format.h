// On-disk layout of a shard file (shard-<rank>.tsr):
//
//   header  (32 B): magic "TSRSHARD", u32 format version, u32 header size,
//                   u64 nominal chunk size, u64 reserved
//   chunks        : independent payloads (zstd frames or raw bytes), back to back
//   table (40 B per chunk): u64 offset, u64 stored length, u64 raw length,
//                   u64 xxh64 of raw bytes, u32 codec, u32 reserved
//   trailer (32 B): u64 table offset, u64 chunk count, u64 xxh64 of the table,
//                   magic "TSRSHEND"
//
// All integers little-endian. The index (index.sqlite) repeats each chunk's
// location, so readers pread a chunk without reading the table; the table
// makes a shard self-describing for verify and repair.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/chunk_codec.h"

namespace tessera::storage {

inline constexpr char kShardMagic[8] = {'T', 'S', 'R', 'S', 'H', 'A', 'R', 'D'};
inline constexpr char kShardEndMagic[8] = {'T', 'S', 'R', 'S', 'H', 'E', 'N', 'D'};
inline constexpr uint32_t kShardFormatVersion = 1;
inline constexpr size_t kShardHeaderSize = 32;
inline constexpr size_t kChunkEntrySize = 40;
inline constexpr size_t kShardTrailerSize = 32;
inline constexpr uint64_t kDefaultChunkSize = 4 << 20;
// Larger chunks are refused by writers and treated as corruption by readers.
inline constexpr uint64_t kMaxChunkSize = 256 << 20;

// Where one chunk lives in a shard file and how to decode it.
struct ChunkLocation {
  uint64_t offset = 0;      // in the shard file
  uint64_t length = 0;      // stored bytes
  uint64_t raw_length = 0;  // decoded bytes
  uint64_t checksum = 0;    // xxh64 of decoded bytes
  Codec codec = Codec::kRaw;
  bool operator==(const ChunkLocation&) const = default;
};

inline void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}
inline void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}
inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string EncodeShardHeader(uint64_t chunk_size);
// Checks magic and version; `file` names the shard in errors.
Status DecodeShardHeader(const char* data, size_t n, const std::string& file);

// Table + trailer for the given chunks, which start at `table_offset`.
std::string EncodeShardFooter(const std::vector<ChunkLocation>& chunks, uint64_t table_offset);

}  // namespace tessera::storage
