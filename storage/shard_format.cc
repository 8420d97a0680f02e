#include "storage/shard_format.h"

namespace tessera::storage {

std::string EncodeShardHeader(uint64_t chunk_size) {
  std::string s(kShardMagic, sizeof(kShardMagic));
  PutU32(&s, kShardFormatVersion);
  PutU32(&s, kShardHeaderSize);
  PutU64(&s, chunk_size);
  PutU64(&s, 0);
  return s;
}

Status DecodeShardHeader(const char* data, size_t n, const std::string& file) {
  if (n < kShardHeaderSize || std::memcmp(data, kShardMagic, sizeof(kShardMagic)) != 0) {
    return DataLoss("shard file " + file + " does not start with the shard magic", {{"file", file}});
  }
  uint32_t version = GetU32(data + 8);
  if (version != kShardFormatVersion) {
    return InvalidArgument("shard file " + file + " has format version " + std::to_string(version) +
                               "; this build reads version " + std::to_string(kShardFormatVersion),
                           {{"file", file}});
  }
  return Status::Ok();
}

std::string EncodeShardFooter(const std::vector<ChunkLocation>& chunks, uint64_t table_offset) {
  std::string table;
  table.reserve(chunks.size() * kChunkEntrySize);
  for (const auto& c : chunks) {
    PutU64(&table, c.offset);
    PutU64(&table, c.length);
    PutU64(&table, c.raw_length);
    PutU64(&table, c.checksum);
    PutU32(&table, static_cast<uint32_t>(c.codec));
    PutU32(&table, 0);
  }
  std::string out = table;
  PutU64(&out, table_offset);
  PutU64(&out, chunks.size());
  PutU64(&out, Checksum(table.data(), table.size()));
  out.append(kShardEndMagic, sizeof(kShardEndMagic));
  return out;
}

}  // namespace tessera::storage
