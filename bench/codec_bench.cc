// tessera_bench_codec: the chunk codec on the bytes of one file, on one core, the way
// the shard writer calls it (EncodeChunk over chunk_size chunks: zstd level --level, a
// chunk kept compressed only when it saves 10 %, every chunk checksummed; DecodeChunk
// back, checksum verified): the float codec for --dtype's width, and plain zstd on the
// same bytes (width 0, kept whenever smaller). bench/float_codec.py feeds it and puts
// its figures beside python3-blosc's.
//
//   tessera_bench_codec --input state.f32 --dtype float32 [--reps 5] [--level 1]
//
// One JSON line per codec: {"codec", "dtype", "raw_bytes", "stored_bytes", "ratio",
// "compress_mbps": [per rep], "decompress_mbps": [per rep], "equal"}.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>

#include "api/json_codec.h"
#include "storage/chunk_codec.h"
#include "storage/shard_format.h"

namespace tessera::storage {
namespace {

struct Stored {
  EncodedChunk e;
  std::string bytes;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Run(const std::string& input, DType dtype, int reps, int level) {
  std::ifstream f(input, std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (raw.empty()) {
    std::fprintf(stderr, "tessera_bench_codec: %s is empty or unreadable\n", input.c_str());
    return 1;
  }
  const size_t chunk = kDefaultChunkSize;
  std::vector<char> buf(MaxEncodedSize(chunk));
  const std::tuple<const char*, int, double> codecs[] = {{"tessera", PlaneWidth(dtype), 0.10}, {"zstd", 0, 0.0}};
  for (const auto& [name, width, min_savings] : codecs) {
    Json compress = Json::array(), decompress = Json::array();
    std::vector<Stored> stored;
    bool equal = true;
    for (int rep = 0; rep < reps; ++rep) {
      stored.clear();
      auto t0 = std::chrono::steady_clock::now();
      for (size_t off = 0; off < raw.size(); off += chunk) {
        const size_t n = std::min(chunk, raw.size() - off);
        EncodedChunk e = EncodeChunk(raw.data() + off, n, true, level, buf.data(), buf.size(), min_savings, width);
        stored.push_back({e, e.codec == Codec::kRaw ? std::string() : std::string(buf.data(), e.length)});
      }
      compress.push_back(raw.size() / Seconds(t0) / 1e6);
      std::string out(raw.size(), '\0');
      t0 = std::chrono::steady_clock::now();
      size_t off = 0;
      for (const Stored& s : stored) {
        const std::string_view bytes = s.e.codec == Codec::kRaw ? std::string_view(raw).substr(off, s.e.raw_length)
                                                                : std::string_view(s.bytes);
        equal = equal && DecodeChunk(s.e.codec, bytes, s.e.raw_length, s.e.checksum, out.data() + off).ok();
        off += s.e.raw_length;
      }
      decompress.push_back(raw.size() / Seconds(t0) / 1e6);
      equal = equal && out == raw;
    }
    uint64_t total = 0;
    for (const Stored& s : stored) total += s.e.length;
    const Json row = {{"codec", name},
                      {"dtype", DTypeName(dtype)},
                      {"raw_bytes", raw.size()},
                      {"stored_bytes", total},
                      {"ratio", static_cast<double>(raw.size()) / static_cast<double>(total)},
                      {"compress_mbps", compress},
                      {"decompress_mbps", decompress},
                      {"equal", equal}};
    std::printf("%s\n", row.dump().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tessera::storage

int main(int argc, char** argv) {
  CLI::App app{"the chunk codec on one file's bytes, one core"};
  std::string input, dtype = "float32";
  int reps = 5, level = 1;
  app.add_option("--input", input, "raw little-endian elements")->required();
  app.add_option("--dtype", dtype, "float32, bfloat16 or float16 (the float codec's width)");
  app.add_option("--reps", reps)->check(CLI::Range(1, 100));
  app.add_option("--level", level)->check(CLI::Range(1, 19));
  CLI11_PARSE(app, argc, argv);
  auto d = tessera::ParseDType(dtype);
  if (!d.ok()) {
    std::fprintf(stderr, "tessera_bench_codec: %s\n", d.status().ToString().c_str());
    return 2;
  }
  return tessera::storage::Run(input, *d, reps, level);
}
