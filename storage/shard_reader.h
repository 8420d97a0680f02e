// Reads chunks of one shard file with pread; each chunk alone, checksum verified.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/env.h"
#include "storage/shard_format.h"

namespace tessera::storage {

class ShardReader {
 public:
  // Opens `path` and checks its header (magic, version) and size.
  static Result<std::unique_ptr<ShardReader>> Open(Env* env, const std::string& path);

  // Reads and decodes one chunk into `out` (loc.raw_length bytes), verifying
  // its checksum. Thread-safe. Errors are data_loss naming the file and offset.
  Status ReadChunk(const ChunkLocation& loc, void* out) const;
  // The chunk table from the file's footer (for verify).
  Result<std::vector<ChunkLocation>> ReadTable() const;

  uint64_t size() const { return file_->Size(); }
  const std::string& path() const { return path_; }

 private:
  ShardReader(std::unique_ptr<RandomAccessFile> file, std::string path)
      : file_(std::move(file)), path_(std::move(path)) {}
  Status Fail(Status st, uint64_t offset) const;

  std::unique_ptr<RandomAccessFile> file_;
  std::string path_;
};

}  // namespace tessera::storage
