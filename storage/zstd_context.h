// One zstd compression and one decompression context per thread, shared by the chunk
// codec and the float codec: creating one per chunk costs more than a small chunk
// takes to compress. ZSTD_compressCCtx ignores a context's parameters; a caller that
// sets some (ZSTD_compress2) resets them first.
#pragma once

#include <zstd.h>

#include <memory>

namespace tessera::storage {

struct ZstdFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

inline ZSTD_CCtx* ThreadZstdCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, ZstdFree> cctx(ZSTD_createCCtx());
  return cctx.get();
}

inline ZSTD_DCtx* ThreadZstdDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, ZstdFree> dctx(ZSTD_createDCtx());
  return dctx.get();
}

}  // namespace tessera::storage
