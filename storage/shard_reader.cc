#include "storage/shard_reader.h"

namespace tessera::storage {

Result<std::unique_ptr<ShardReader>> ShardReader::Open(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
  if (file->Size() < kShardHeaderSize + kShardTrailerSize) {
    return DataLoss("shard file " + path + " is truncated (" + std::to_string(file->Size()) +
                        " bytes)",
                    {{"file", path}});
  }
  char header[kShardHeaderSize];
  RETURN_IF_ERROR(file->Read(0, sizeof(header), header));
  RETURN_IF_ERROR(DecodeShardHeader(header, sizeof(header), path));
  return std::unique_ptr<ShardReader>(new ShardReader(std::move(file), path));
}

Status ShardReader::Fail(Status st, uint64_t offset) const {
  return Status(st.code(), "chunk at offset " + std::to_string(offset) + " of " + path_ + ": " +
                               st.message(),
                {{"file", path_}, {"offset", offset}});
}

Status ShardReader::ReadChunk(const ChunkLocation& loc, void* out) const {
  if (loc.offset < kShardHeaderSize || loc.offset + loc.length > file_->Size() ||
      loc.offset + loc.length < loc.offset || loc.raw_length > kMaxChunkSize) {
    return Fail(DataLoss("lies outside the file (" + std::to_string(file_->Size()) +
                         " bytes); the shard is truncated or the index is wrong"),
                loc.offset);
  }
  if (loc.codec == Codec::kRaw) {
    // Raw chunks decode in place: read straight into the destination.
    if (loc.length != loc.raw_length) return Fail(DataLoss("raw chunk length mismatch"), loc.offset);
    Status st = file_->Read(loc.offset, loc.length, out);
    if (st.ok() && Checksum(out, loc.raw_length) != loc.checksum) {
      st = DataLoss("checksum mismatch (xxh64 of the raw bytes differs from the index)");
    }
    return st.ok() ? st : Fail(st, loc.offset);
  }
  thread_local std::string buf;
  buf.resize(loc.length);
  Status st = file_->Read(loc.offset, loc.length, buf.data());
  if (st.ok()) st = DecodeChunk(loc.codec, buf, loc.raw_length, loc.checksum, out);
  return st.ok() ? st : Fail(st, loc.offset);
}

Result<std::vector<ChunkLocation>> ShardReader::ReadTable() const {
  char trailer[kShardTrailerSize];
  uint64_t size = file_->Size();
  RETURN_IF_ERROR(file_->Read(size - kShardTrailerSize, sizeof(trailer), trailer));
  if (std::memcmp(trailer + 24, kShardEndMagic, sizeof(kShardEndMagic)) != 0) {
    return DataLoss("shard file " + path_ + " has no trailer (truncated or never finished)",
                    {{"file", path_}});
  }
  uint64_t table_offset = GetU64(trailer), count = GetU64(trailer + 8);
  if (count > size / kChunkEntrySize || table_offset < kShardHeaderSize ||
      table_offset + count * kChunkEntrySize != size - kShardTrailerSize) {
    return DataLoss("shard file " + path_ + " has an inconsistent chunk table", {{"file", path_}});
  }
  std::string table(count * kChunkEntrySize, '\0');
  RETURN_IF_ERROR(file_->Read(table_offset, table.size(), table.data()));
  if (Checksum(table.data(), table.size()) != GetU64(trailer + 16)) {
    return DataLoss("shard file " + path_ + ": chunk table checksum mismatch", {{"file", path_}});
  }
  std::vector<ChunkLocation> out;
  for (uint64_t i = 0; i < count; ++i) {
    const char* p = table.data() + i * kChunkEntrySize;
    out.push_back({GetU64(p), GetU64(p + 8), GetU64(p + 16), GetU64(p + 24),
                   static_cast<Codec>(GetU32(p + 32))});
  }
  return out;
}

}  // namespace tessera::storage
