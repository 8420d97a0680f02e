// The shard-file reader (storage/shard_reader.h, shard_format.h, chunk_codec.h).
//
// The input is one byte naming a rank (mod 4) followed by a shard file. The
// file is read alone: ShardReader::Open, its chunk table, and every chunk the
// table claims; then again with the table's checksum in the trailer made to
// match, so that damaged tables reach the chunk reads. Then it replaces that
// rank's shard-<rank>.tsr in a committed checkpoint (its index unchanged), and
// the checkpoint is verified and read back. Properties checked:
//  - every failure is data_loss or invalid_argument naming the file;
//  - a raw chunk that reads back equals the file's bytes at its offset;
//  - when the checkpoint verifies, every tensor reads back exactly as saved.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz/checkpoint_inputs.h"
#include "storage/shard_format.h"
#include "storage/shard_reader.h"

namespace tessera::storage {
namespace {

void CheckError(const Status& st, const std::string& what) {
  FUZZ_CHECK(fuzz::IsCleanError(st, {Code::kDataLoss, Code::kInvalidArgument}),
             what + ": " + st.ToString());
  if (!st.ok()) FUZZ_CHECK(st.details().contains("file"), what + " does not name the file");
}

void ReadShard(MemEnv* env, std::string_view bytes) {
  const std::string path = "alone/shard-0.tsr";
  static const bool made = env->CreateDirs("alone").ok();
  FUZZ_CHECK(made, "CreateDirs");
  FUZZ_CHECK(WriteFileDurably(env, path, bytes).ok(), "write");
  auto reader = ShardReader::Open(env, path);
  CheckError(reader.status(), "Open");
  if (!reader.ok()) return;
  FUZZ_CHECK((*reader)->size() == bytes.size(), "size");
  auto table = (*reader)->ReadTable();
  CheckError(table.status(), "ReadTable");
  if (!table.ok()) return;
  for (const ChunkLocation& loc : *table) {
    if (loc.raw_length > fuzz::kMaxReadBytes) continue;
    std::unique_ptr<char[]> out(new char[loc.raw_length + 1]);
    Status st = (*reader)->ReadChunk(loc, out.get());
    CheckError(st, "ReadChunk");
    if (st.ok() && loc.codec == Codec::kRaw) {
      FUZZ_CHECK(loc.offset + loc.length <= bytes.size() &&
                     bytes.substr(loc.offset, loc.length) == std::string_view(out.get(), loc.raw_length),
                 "a raw chunk reads other bytes than the file holds");
    }
  }
}

// The file with its trailer's table checksum recomputed, when its trailer
// places a table inside the file; empty otherwise.
std::string WithTableChecksum(std::string_view bytes) {
  if (bytes.size() < kShardHeaderSize + kShardTrailerSize) return {};
  const char* trailer = bytes.data() + bytes.size() - kShardTrailerSize;
  const uint64_t table_offset = GetU64(trailer), count = GetU64(trailer + 8);
  const uint64_t table_end = bytes.size() - kShardTrailerSize;
  if (count > table_end / kChunkEntrySize || table_offset > table_end ||
      table_end - table_offset != count * kChunkEntrySize) {
    return {};
  }
  std::string fixed(bytes);
  const uint64_t sum = Checksum(fixed.data() + table_offset, count * kChunkEntrySize);
  for (int i = 0; i < 8; ++i) fixed[table_end + 16 + i] = static_cast<char>(sum >> (8 * i));
  return fixed;
}

}  // namespace
}  // namespace tessera::storage

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::storage;
  static fuzz::SavedCheckpoint* ck = new fuzz::SavedCheckpoint();
  if (size < 1) return 0;
  const std::string_view shard(reinterpret_cast<const char*>(data) + 1, size - 1);
  ReadShard(&ck->env, shard);
  if (std::string fixed = WithTableChecksum(shard); !fixed.empty() && fixed != shard) {
    ReadShard(&ck->env, fixed);
  }
  const std::string file = ShardFileName(data[0] % 4);
  static std::string originals[4];
  std::string& original = originals[data[0] % 4];
  if (original.empty()) original = ck->Read(file);
  ck->Write(file, shard);
  fuzz::ReadEverything(&ck->env, ck->dir, ck->tensors);
  ck->Write(file, original);
  return 0;
}
