// The checkpoint index. Each writer records its slices in a fragment
// (fragment-<rank>.sqlite); after the write barrier the fragments are merged
// into index.sqlite — the only thing a reader needs:
//   meta(key, value)      format_version, mesh, step, metadata, created_at_ms
//   tensors(id, name, dtype, shape, layout, elements)
//   slices(id, tensor_id, offsets, lengths, elements, file)
//   chunks(slice_id, raw_offset, offset, length, raw_length, codec, checksum)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/status.h"
#include "storage/env.h"
#include "storage/fragment_json.h"
#include "api/tensor_desc.h"
#include "storage/shard_writer.h"
#include "storage/sqlite_db.h"

namespace tessera::storage {

// Version 2: the file is the SQLite image followed by a 16-byte trailer, the
// magic "TSRXSUM1" and the xxh64 of the image (little-endian), so that any
// changed bit is caught on open. Version 3 adds chunks.file, a chunk of an
// incremental checkpoint in an earlier checkpoint's file (chunk_ref.h). Versions 1
// (no trailer) and 2 are still read.
inline constexpr int kIndexFormatVersion = 3;
inline constexpr int kSealedIndexFormatVersion = 2;  // the first with the trailer
inline constexpr int kUnsealedIndexFormatVersion = 1;
inline constexpr const char* kIndexFile = "index.sqlite";
inline constexpr char kIndexSealMagic[] = "TSRXSUM1";  // 8 bytes, without its NUL
inline constexpr size_t kIndexSealBytes = 16;

// The bytes of index.sqlite for an SQLite image: the image and its trailer.
std::string SealIndexImage(std::string image);

std::string FragmentFileName(int64_t rank);  // "fragment-<rank>.sqlite"
std::string ShardFileName(int64_t rank);     // "shard-<rank>.tsr"
// "shard-<rank>-<tag>.tsr": a worker's shard of one save attempt (the tag is its own),
// so that a late writer of an abandoned attempt never overwrites a newer one's file.
std::string ShardFileName(int64_t rank, const std::string& tag);

using ::tessera::TensorMeta;

// One writer's part of the index.
class FragmentBuilder {
 public:
  static Result<FragmentBuilder> Create();
  // Records that `file` (a shard file name, relative to the checkpoint dir)
  // holds `slice` of `tensor` in `chunks`.
  Status AddSlice(const TensorMeta& tensor, const SliceSpec& slice, const std::string& file,
                  const std::vector<SliceChunk>& chunks);
  // The fragment's SQLite image.
  Result<std::string> Image();
  // Writes the fragment to `path` and fsyncs it.
  Status WriteTo(Env* env, const std::string& path);

 private:
  explicit FragmentBuilder(SqliteDb db) : db_(std::move(db)) {}
  SqliteDb db_;
  int64_t next_slice_ = 1;
};

// Everything a checkpoint's index records besides the tensors.
struct CheckpointMeta {
  Mesh mesh;
  int64_t step = 0;
  Json metadata = Json::object();
  int64_t created_at_ms = 0;
};

// Merges the fragments in `dir` into `dir`/index.sqlite (fsynced) and deletes
// the fragments (the commit's sync of `dir` makes that durable). Tensors recorded differently by two writers, or whose slices
// do not cover them exactly once, are errors naming the tensor.
Status MergeFragments(Env* env, const std::string& dir, const std::vector<std::string>& fragments,
                      const CheckpointMeta& meta);
// The same for fragments as data (one per writer, as their joins carried them): writes
// `dir`/index.sqlite and fsyncs it; the directory's own sync is the commit's.
Status MergeSlices(Env* env, const std::string& dir,
                   const std::vector<std::vector<FragmentSlice>>& fragments,
                   const CheckpointMeta& meta);

struct SliceEntry {
  SliceSpec slice;
  std::string file;
  std::vector<SliceChunk> chunks;  // ascending raw_offset, covering the slice
};

struct TensorEntry {
  TensorMeta meta;
  std::vector<SliceEntry> slices;
  uint64_t stored_bytes = 0;
};

// A loaded index.sqlite.
class CheckpointIndex {
 public:
  // Reads `dir`/index.sqlite. Missing → not_found; garbage, wrong schema or
  // inconsistent rows → data_loss; another format version → invalid_argument.
  static Result<CheckpointIndex> Open(Env* env, const std::string& dir);

  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorEntry* Find(const std::string& name) const;
  const CheckpointMeta& meta() const { return meta_; }
  int format_version() const { return format_version_; }
  uint64_t logical_bytes() const;
  uint64_t stored_bytes() const;
  // Shard files of its own dir the index refers to (plain names).
  std::vector<std::string> files() const;
  // Files of earlier checkpoints' dirs it refers to ("../<dir>/<name>", chunk_ref.h).
  std::vector<std::string> referenced_files() const;
  // Stored bytes of its chunks in earlier checkpoints' files (in stored_bytes too).
  uint64_t referenced_bytes() const;

 private:
  // The steps of Open, each reading one table of the index's database (index.cc).
  Status LoadMeta(SqliteDb& db, const std::string& path, bool sealed);
  Status LoadTensors(SqliteDb& db, const std::string& path, std::map<int64_t, size_t>* by_id);
  Status LoadSlices(SqliteDb& db, const std::string& path, const std::map<int64_t, size_t>& tensors,
                    std::map<int64_t, std::pair<size_t, size_t>>* by_id);
  Status LoadChunks(SqliteDb& db, const std::string& path,
                    const std::map<int64_t, std::pair<size_t, size_t>>& slices);
  // Slices tile each tensor and chunks each slice's bytes: readers rely on it.
  Status CheckCoverage(const std::string& path) const;

  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t> by_name_;
  CheckpointMeta meta_;
  int format_version_ = 0;
};

}  // namespace tessera::storage
