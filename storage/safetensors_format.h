// The safetensors file format (docs/format.md, "Safetensors"), both ways: the header a
// writer puts at the front of a file, and the checked reading of a file's header.
//
// A file: 8-byte little-endian header size N, N bytes of JSON
//   {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {string: string}}
// padded with spaces, then the tensors' bytes; offsets count from the first byte
// after the header.
//
// Reading never trusts the file: a header size past the end, offsets that overlap,
// run out of the file or disagree with the shape, or malformed JSON are data_loss; a
// header over kMaxSafetensorsHeader, a dtype Tessera cannot hold or a name Tessera
// cannot take is invalid_argument. Every error names the file, and the tensor where
// there is one (details "file", "tensor").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

// The largest header read (safetensors' own readers refuse more, too).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

// safetensors' name of a dtype: "F32", "BF16", "I64", "BOOL", ...
std::string SafetensorsDType(DType dtype);
// The dtype of a safetensors name; invalid_argument naming `file` and `tensor` for a
// name safetensors has and Tessera does not (U16, F8_E4M3, ...) or an unknown one.
Result<DType> DTypeOfSafetensors(std::string_view name, const std::string& file,
                                 const std::string& tensor);

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // of its first byte in the file (header included)
  uint64_t bytes = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                 // 8 + the header's size
  std::vector<SafetensorsTensor> tensors;  // in file order (by offset)
  Json metadata = Json::object();          // __metadata__, {} when absent
};

// Writer side: one tensor of a file's header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};
// The 8-byte size and the JSON header of a file holding `tensors` in this order,
// back to back, padded to a multiple of 8.
std::string EncodeSafetensorsHeader(const std::vector<SafetensorsEntry>& tensors,
                                    const Json& metadata);

// The header size in a file's first 8 bytes, checked against the file's size.
Result<uint64_t> ParseSafetensorsPrefix(std::string_view first8, uint64_t file_size,
                                        const std::string& file);
// The header's JSON (`json`, as long as the prefix said) of a file of `file_size`.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t file_size,
                                                 const std::string& file);
// Both, read from the file at `path`.
Result<SafetensorsHeader> ReadSafetensorsHeader(Env* env, const std::string& path);

}  // namespace tessera::storage
