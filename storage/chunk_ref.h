// Where an incremental checkpoint's unchanged chunks are: a chunk not written again
// refers to the shard file of an earlier checkpoint of the same mesh that holds it,
// by a path relative to the checkpoint's own dir, "../<dir>/<name>" (docs/format.md,
// "Incremental checkpoints"). <dir> is that checkpoint's dir in the mesh dir:
// "step-<N>" on a file system, ".staging-<N>-<id>" (the prefix its manifest names) on
// an object store. A reference always names the file that holds the bytes, never
// another reference, so a read follows one hop.
#pragma once

#include <string>

#include "storage/index.h"

namespace tessera::storage {

struct ChunkRef {
  std::string dir;   // "step-10"
  std::string name;  // "shard-0-0123456789abcdef.tsr"
  std::string ToString() const { return "../" + dir + "/" + name; }
};

// The reference `file` holds; nullopt for a plain file name, or for a text that is
// neither (a reader treats that as corrupt).
std::optional<ChunkRef> ParseChunkRef(const std::string& file);
// A plain shard file name: not empty, no '/', not starting with '.', at most 255 bytes.
bool IsPlainFileName(const std::string& name);

// The file a chunk of `slice` is in: its own reference, else the slice's file.
inline const std::string& ChunkFile(const SliceEntry& slice, const SliceChunk& chunk) {
  return chunk.file.empty() ? slice.file : chunk.file;
}
// The path of `file` (a plain name or a reference) for the checkpoint in `dir`.
std::string ResolveChunkFile(const std::string& dir, const std::string& file);

}  // namespace tessera::storage
