#include "storage/float_planes.h"

// ZSTD_c_literalCompressionMode is in zstd's experimental API (stable since 1.5.0).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "storage/zstd_context.h"

#include <cstring>
#include <string>
#include <vector>

namespace tessera::storage {
namespace {

// A plane is compressed only when a sample of it saves this much: mantissa planes are
// near random, and zstd would spend its time finding that out on every byte.
constexpr size_t kSample = 16 << 10;
constexpr double kPlaneSavings = 0.03;

// One plane as a zstd frame. A float plane has almost no repeats worth a match search:
// what pays is the entropy coding of its literals. So at the default level 1 the
// frame is made at zstd's fastest level with its literals Huffman-coded all the same
// (zstd leaves them raw at negative levels otherwise); a higher level is honoured.
size_t CompressPlane(char* dst, size_t capacity, const uint8_t* src, size_t n, int level) {
  ZSTD_CCtx* c = ThreadZstdCCtx();
  ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level <= 1 ? ZSTD_minCLevel() : level);
  ZSTD_CCtx_setParameter(c, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  return ZSTD_compress2(c, dst, capacity, src, n);
}

// The scratch planes of this thread, at least `bytes` long.
uint8_t* Scratch(size_t bytes) {
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  return scratch.data();
}

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

template <typename T>
void Split(const uint8_t* src, size_t m, uint8_t* const* planes) {
  // One pass per plane over whole elements: each loop vectorizes (a shift and a narrowing).
  for (size_t b = 0; b < sizeof(T); ++b) {
    uint8_t* p = planes[b];
    for (size_t i = 0; i < m; ++i) {
      T v;
      std::memcpy(&v, src + i * sizeof(T), sizeof(T));
      p[i] = static_cast<uint8_t>(v >> (8 * b));
    }
  }
}

template <typename T>
void Join(const uint8_t* const* planes, size_t m, uint8_t* dst) {
  for (size_t i = 0; i < m; ++i) {
    T v = 0;
    for (size_t b = 0; b < sizeof(T); ++b) v = static_cast<T>(v | (static_cast<T>(planes[b][i]) << (8 * b)));
    std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
  }
}

}  // namespace

void SplitPlanes(const uint8_t* src, size_t m, int w, uint8_t* const* planes) {
  if (w == 2) {
    Split<uint16_t>(src, m, planes);
  } else {
    Split<uint32_t>(src, m, planes);
  }
}

void JoinPlanes(const uint8_t* const* planes, size_t m, int w, uint8_t* dst) {
  if (w == 2) {
    Join<uint16_t>(planes, m, dst);
  } else {
    Join<uint32_t>(planes, m, dst);
  }
}

size_t EncodePlanes(const void* data, size_t n, int w, int level, char* out, size_t out_capacity) {
  const size_t m = n / static_cast<size_t>(w);
  const size_t tail = n - m * static_cast<size_t>(w);
  const size_t head = 4 * static_cast<size_t>(w);
  if (out_capacity < n + head) return 0;
  uint8_t* scratch = Scratch(n);
  uint8_t* planes[4] = {};
  for (int b = 0; b < w; ++b) planes[b] = scratch + static_cast<size_t>(b) * m;
  SplitPlanes(static_cast<const uint8_t*>(data), m, w, planes);
  size_t at = head;
  for (int b = 0; b < w; ++b) {
    // Compressed when a sample pays (or the plane is a sample's size), and kept only
    // when smaller than the plane.
    size_t len = m;
    bool try_zstd = m > 0;
    if (m > kSample) {
      const size_t s = CompressPlane(out + at, out_capacity - at, planes[b], kSample, level);
      try_zstd = !ZSTD_isError(s) && s < static_cast<size_t>(kSample * (1 - kPlaneSavings));
    }
    if (try_zstd) {
      const size_t z = CompressPlane(out + at, std::min(out_capacity - at, m), planes[b], m, level);
      if (!ZSTD_isError(z) && z < m) len = z;
    }
    if (len == m) std::memcpy(out + at, planes[b], m);
    PutU32(out + 4 * b, static_cast<uint32_t>(len));
    at += len;
  }
  std::memcpy(out + at, static_cast<const char*>(data) + m * static_cast<size_t>(w), tail);
  return at + tail;
}

Status DecodePlanes(std::string_view stored, uint64_t raw_length, int w, void* out) {
  const size_t m = raw_length / static_cast<uint64_t>(w);
  const size_t tail = raw_length - m * static_cast<uint64_t>(w);
  const size_t head = 4 * static_cast<size_t>(w);
  if (stored.size() < head + tail) {
    return DataLoss("a float chunk of " + std::to_string(stored.size()) + " bytes is shorter than its plane table");
  }
  uint8_t* scratch = Scratch(m * static_cast<size_t>(w));
  const uint8_t* planes[4] = {};
  size_t at = head;
  for (int b = 0; b < w; ++b) {
    const size_t len = GetU32(stored.data() + 4 * b);
    if (len > m || at + len + tail > stored.size()) {
      return DataLoss("float chunk plane " + std::to_string(b) + " claims " + std::to_string(len) +
                      " bytes; the chunk holds " + std::to_string(stored.size()) + " for " +
                      std::to_string(m) + " elements");
    }
    uint8_t* plane = scratch + static_cast<size_t>(b) * m;
    if (len == m) {
      planes[b] = reinterpret_cast<const uint8_t*>(stored.data() + at);  // raw: read in place
    } else {
      const size_t got = ZSTD_decompressDCtx(ThreadZstdDCtx(), plane, m, stored.data() + at, len);
      if (ZSTD_isError(got) || got != m) {
        return DataLoss("float chunk plane " + std::to_string(b) + " does not decode to " + std::to_string(m) +
                        " bytes" + (ZSTD_isError(got) ? std::string(": ") + ZSTD_getErrorName(got) : ""));
      }
      planes[b] = plane;
    }
    at += len;
  }
  if (at + tail != stored.size()) {
    return DataLoss("a float chunk holds " + std::to_string(stored.size()) + " bytes where its planes end at " +
                    std::to_string(at + tail));
  }
  JoinPlanes(planes, m, w, static_cast<uint8_t*>(out));
  std::memcpy(static_cast<uint8_t*>(out) + m * static_cast<size_t>(w), stored.data() + at, tail);
  return Status::Ok();
}

}  // namespace tessera::storage
