#include "storage/chunk_codec.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <xxhash.h>
#include <zstd.h>

namespace tessera::storage {
namespace {

// One context per thread: creating one per chunk costs more than small chunks compress.
struct ZstdFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, ZstdFree> cctx(ZSTD_createCCtx());
  return cctx.get();
}

ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, ZstdFree> dctx(ZSTD_createDCtx());
  return dctx.get();
}

}  // namespace

std::string_view CodecName(Codec codec) { return codec == Codec::kZstd ? "zstd" : "none"; }

Result<Codec> ParseCodec(std::string_view name) {
  if (name == "zstd") return Codec::kZstd;
  if (name == "none" || name == "raw") return Codec::kRaw;
  return InvalidArgument("unknown compression '" + std::string(name) + "' (expected zstd or none)",
                         {{"field", "compression"}});
}

uint64_t Checksum(const void* data, size_t n) { return XXH64(data, n, 0); }

size_t MaxEncodedSize(size_t n) { return ZSTD_compressBound(n); }

EncodedChunk EncodeChunk(const void* data, size_t n, bool compress, int level, char* out,
                         size_t out_capacity, double min_savings) {
  EncodedChunk e;
  e.length = n;
  e.raw_length = n;
  e.checksum = Checksum(data, n);
  if (!compress || n == 0 || out == nullptr) return e;
  size_t len = ZSTD_compressCCtx(ThreadCCtx(), out, out_capacity, data, n, level);
  const size_t worth = std::min<size_t>(n - n / 64, static_cast<size_t>(n * (1 - min_savings)));
  if (ZSTD_isError(len) || len > worth) return e;  // does not pay: store raw
  e.codec = Codec::kZstd;
  e.length = len;
  return e;
}

Status DecodeChunk(Codec codec, std::string_view stored, uint64_t raw_length, uint64_t checksum,
                   void* out) {
  if (codec == Codec::kRaw) {
    if (stored.size() != raw_length) {
      return DataLoss("raw chunk holds " + std::to_string(stored.size()) + " bytes, expected " +
                      std::to_string(raw_length));
    }
    std::memcpy(out, stored.data(), raw_length);
  } else if (codec == Codec::kZstd) {
    size_t len = ZSTD_decompressDCtx(ThreadDCtx(), out, raw_length, stored.data(), stored.size());
    if (ZSTD_isError(len)) {
      return DataLoss(std::string("zstd frame does not decode: ") + ZSTD_getErrorName(len));
    }
    if (len != raw_length) {
      return DataLoss("zstd frame decodes to " + std::to_string(len) + " bytes, expected " +
                      std::to_string(raw_length));
    }
  } else {
    return DataLoss("unknown codec " + std::to_string(static_cast<uint32_t>(codec)));
  }
  if (Checksum(out, raw_length) != checksum) {
    return DataLoss("checksum mismatch (xxh64 of the raw bytes differs from the index)");
  }
  return Status::Ok();
}

}  // namespace tessera::storage
