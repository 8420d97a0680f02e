// A writer's fragment as data: the slices it stored and where their chunks are, as a
// worker's join carries them to tesserad (docs/architecture.md, "The save"), instead of
// a fragment-<rank>.sqlite in the staging dir. tesserad merges these into index.sqlite
// (MergeSlices, index.h).
//   [{"tensor": {name, dtype, shape, layout}, "slice": {offsets, lengths}, "file": "shard-…",
//     "chunks": [[raw_offset, offset, length, raw_length, codec, checksum], …]}, …]
#pragma once

#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/tensor_desc.h"
#include "storage/shard_writer.h"

namespace tessera::storage {

// One slice a writer stored: `slice` of `tensor`, in shard file `file` (a name in the
// checkpoint dir), cut into `chunks` (ascending raw_offset, covering its bytes).
struct FragmentSlice {
  TensorMeta tensor;
  SliceSpec slice;
  std::string file;
  std::vector<SliceChunk> chunks;
};

Json FragmentToJson(const std::vector<FragmentSlice>& slices);
// What another process sent: every field checked (the tensor's name, dtype and shape,
// the slice inside the shape, the file a plain name, the chunks tiling the slice's
// bytes with a known codec); invalid_argument naming the field and the tensor otherwise.
Result<std::vector<FragmentSlice>> FragmentFromJson(const Json& j);

}  // namespace tessera::storage
