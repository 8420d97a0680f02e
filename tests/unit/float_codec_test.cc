// The float codec (storage/float_planes.h): byte planes round-trip bit for bit over
// every length and width, pay on N(0, 0.02) float32 and bfloat16 (the ratios the
// format promises), fall back to raw on noise, and a damaged planes chunk is data_loss
// saying what does not fit, never a crash.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "storage/chunk_codec.h"
#include "storage/float_planes.h"
#include "storage/shard_writer.h"
#include "storage/synthetic.h"
#include "storage/testing/mem_env.h"

namespace tessera::storage {
namespace {

std::string Noise(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(gen());
  return s;
}

EncodedChunk Encode(const std::string& raw, int width, std::string* stored, double min_savings = 0) {
  std::string buf(MaxEncodedSize(raw.size()), '\0');
  EncodedChunk e = EncodeChunk(raw.data(), raw.size(), true, 1, buf.data(), buf.size(), min_savings, width);
  *stored = e.codec == Codec::kRaw ? raw : buf.substr(0, e.length);
  return e;
}

TEST(FloatPlanes, SplitAndJoinAreInverseAndPlaneIHoldsByteI) {
  const std::string raw = Noise(4 * 1000, 1);
  for (int w : {2, 4}) {
    const size_t m = raw.size() / w;
    std::vector<std::vector<uint8_t>> planes(w, std::vector<uint8_t>(m));
    std::vector<uint8_t*> p;
    for (auto& v : planes) p.push_back(v.data());
    SplitPlanes(reinterpret_cast<const uint8_t*>(raw.data()), m, w, p.data());
    for (size_t i = 0; i < m; i += 97) {
      for (int b = 0; b < w; ++b) EXPECT_EQ(planes[b][i], static_cast<uint8_t>(raw[i * w + b]));
    }
    std::string back(raw.size(), '\0');
    std::vector<const uint8_t*> cp(p.begin(), p.end());
    JoinPlanes(cp.data(), m, w, reinterpret_cast<uint8_t*>(back.data()));
    EXPECT_EQ(back, raw);
  }
}

TEST(FloatPlanes, EveryLengthRoundTripsBitForBit) {
  for (int w : {2, 4}) {
    for (size_t n : {1u, 2u, 3u, 5u, 63u, 64u, 255u, 4096u, 4099u, 100001u}) {
      for (bool floats : {true, false}) {
        std::string raw = floats ? SyntheticBytes(DType::kFloat32, static_cast<int64_t>(n / 4 + 1), n) : Noise(n, 3);
        raw.resize(n);
        std::string buf(MaxEncodedSize(n), '\0');
        const size_t len = EncodePlanes(raw.data(), n, w, 1, buf.data(), buf.size());
        ASSERT_GT(len, 0u);
        std::string out(n, 'x');
        Status st = DecodePlanes(std::string_view(buf.data(), len), n, w, out.data());
        ASSERT_TRUE(st.ok()) << "w=" << w << " n=" << n << ": " << st.ToString();
        EXPECT_EQ(out, raw) << "w=" << w << " n=" << n;
      }
    }
  }
}

TEST(FloatPlanes, PaysOnTrainedLikeFloatsAndNotOnNoise) {
  // N(0, 0.02): the ratios docs/format.md gives for the float codec at zstd level 1.
  struct Case {
    DType dtype;
    Codec codec;
    double ratio;
  };
  for (const Case& c : {Case{DType::kFloat32, Codec::kPlanes4, 1.12}, Case{DType::kBFloat16, Codec::kPlanes2, 1.40},
                        Case{DType::kFloat16, Codec::kPlanes2, 1.12}}) {
    const std::string raw = SyntheticBytes(c.dtype, 1 << 20, 5);
    std::string stored;
    EncodedChunk e = Encode(raw, PlaneWidth(c.dtype), &stored, 0.10);
    ASSERT_EQ(e.codec, c.codec) << DTypeName(c.dtype);
    EXPECT_GE(static_cast<double>(raw.size()) / e.length, c.ratio) << DTypeName(c.dtype);
    std::string out(raw.size(), '\0');
    ASSERT_TRUE(DecodeChunk(e.codec, stored, e.raw_length, e.checksum, out.data()).ok());
    EXPECT_EQ(out, raw);
  }
  std::string stored;
  EXPECT_EQ(Encode(Noise(1 << 20, 9), 4, &stored, 0.10).codec, Codec::kRaw);
  EXPECT_EQ(PlaneWidth(DType::kInt32), 0);
  EXPECT_EQ(PlaneWidth(DType::kFloat64), 0);
}

TEST(FloatPlanes, ADamagedChunkIsDataLossNeverACrash) {
  const std::string raw = SyntheticBytes(DType::kFloat32, 1 << 16, 2);
  std::string stored;
  EncodedChunk e = Encode(raw, 4, &stored);
  ASSERT_EQ(e.codec, Codec::kPlanes4);
  std::string out(raw.size(), '\0');
  auto decode = [&](const std::string& s) { return DecodeChunk(e.codec, s, e.raw_length, e.checksum, out.data()); };
  ASSERT_TRUE(decode(stored).ok());
  // A plane length past the chunk, a truncated chunk, a flipped byte in each plane.
  std::string bad = stored;
  bad[3] = static_cast<char>(0x7f);
  EXPECT_EQ(decode(bad).code(), Code::kDataLoss);
  EXPECT_NE(decode(bad).message().find("plane 0"), std::string::npos) << decode(bad).ToString();
  EXPECT_EQ(decode(stored.substr(0, stored.size() - 1)).code(), Code::kDataLoss);
  EXPECT_EQ(decode(stored.substr(0, 7)).code(), Code::kDataLoss);
  for (size_t at = 16; at < stored.size(); at += stored.size() / 13) {
    bad = stored;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    EXPECT_EQ(decode(bad).code(), Code::kDataLoss) << "flip at " << at;
  }
  EXPECT_TRUE(IsCodec(3));
  EXPECT_FALSE(IsCodec(4));
}

TEST(FloatPlanes, AShardWriterCodesFloatSlicesAsPlanesWhenItPays) {
  MemEnv env;
  ShardOptions opt;
  opt.chunk_size = 64 << 10;
  auto w = ShardWriter::Create(&env, "s.tsr", opt);
  ASSERT_TRUE(w.ok());
  const std::string f32 = SyntheticBytes(DType::kFloat32, 1 << 18, 1);
  const std::string noise = Noise(1 << 20, 4);
  const size_t a = *(*w)->Add(f32.data(), f32.size(), 4);
  const size_t b = *(*w)->Add(noise.data(), noise.size(), 4);
  ASSERT_TRUE((*w)->Finish().ok());
  std::set<Codec> fa, fb;
  for (const auto& c : (*w)->chunks(a)) fa.insert(c.loc.codec);
  for (const auto& c : (*w)->chunks(b)) fb.insert(c.loc.codec);
  EXPECT_EQ(fa, std::set<Codec>{Codec::kPlanes4});
  EXPECT_EQ(fb, std::set<Codec>{Codec::kRaw});  // the sample did not pay
  EXPECT_LT((*w)->stored_bytes(), f32.size() / 1.12 + noise.size() + (64 << 10));
}

}  // namespace
}  // namespace tessera::storage
