#include "storage/chunk_codec.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <xxhash.h>
#include <zstd.h>

#include "storage/float_planes.h"
#include "storage/zstd_context.h"

namespace tessera::storage {

std::string_view CodecName(Codec codec) { return codec == Codec::kZstd ? "zstd" : "none"; }

Result<Codec> ParseCodec(std::string_view name) {
  if (name == "zstd") return Codec::kZstd;
  if (name == "none" || name == "raw") return Codec::kRaw;
  return InvalidArgument("unknown compression '" + std::string(name) + "' (expected zstd or none)",
                         {{"field", "compression"}});
}

uint64_t Checksum(const void* data, size_t n) { return XXH64(data, n, 0); }

bool IsCodec(uint64_t value) { return value <= static_cast<uint64_t>(Codec::kPlanes4); }

int PlaneWidth(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    default: return 0;
  }
}

// ZSTD_compressBound(n) is at least n + 64 for any n, room for a planes chunk's table.
size_t MaxEncodedSize(size_t n) { return ZSTD_compressBound(n); }

EncodedChunk EncodeChunk(const void* data, size_t n, bool compress, int level, char* out,
                         size_t out_capacity, double min_savings, int width) {
  return EncodeSummedChunk(data, n, Checksum(data, n), compress, level, out, out_capacity,
                           min_savings, width);
}

EncodedChunk EncodeSummedChunk(const void* data, size_t n, uint64_t checksum, bool compress,
                               int level, char* out, size_t out_capacity, double min_savings,
                               int width) {
  EncodedChunk e;
  e.length = n;
  e.raw_length = n;
  e.checksum = checksum;
  if (!compress || n == 0 || out == nullptr) return e;
  const size_t worth = std::min<size_t>(n - n / 64, static_cast<size_t>(n * (1 - min_savings)));
  if (width == 2 || width == 4) {
    const size_t len = EncodePlanes(data, n, width, level, out, out_capacity);
    if (len == 0 || len > worth) return e;  // does not pay: store raw
    e.codec = width == 2 ? Codec::kPlanes2 : Codec::kPlanes4;
    e.length = len;
    return e;
  }
  size_t len = ZSTD_compressCCtx(ThreadZstdCCtx(), out, out_capacity, data, n, level);
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
    size_t len = ZSTD_decompressDCtx(ThreadZstdDCtx(), out, raw_length, stored.data(), stored.size());
    if (ZSTD_isError(len)) {
      return DataLoss(std::string("zstd frame does not decode: ") + ZSTD_getErrorName(len));
    }
    if (len != raw_length) {
      return DataLoss("zstd frame decodes to " + std::to_string(len) + " bytes, expected " +
                      std::to_string(raw_length));
    }
  } else if (codec == Codec::kPlanes2 || codec == Codec::kPlanes4) {
    RETURN_IF_ERROR(DecodePlanes(stored, raw_length, codec == Codec::kPlanes2 ? 2 : 4, out));
  } else {
    return DataLoss("unknown codec " + std::to_string(static_cast<uint32_t>(codec)));
  }
  if (Checksum(out, raw_length) != checksum) {
    return DataLoss("checksum mismatch (xxh64 of the raw bytes differs from the index)");
  }
  return Status::Ok();
}

}  // namespace tessera::storage
