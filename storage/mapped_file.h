// A file of a file system mapped read-only into memory, unmapped when it goes: its
// bytes read without copying them (a safetensors import's tensors, an export's raw
// chunks). The file must not shrink while it is mapped. Made by Env::MapFile (the
// POSIX Env calls Open).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "api/status.h"

namespace tessera::storage {

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tessera::storage
