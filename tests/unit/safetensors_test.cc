// The safetensors format both ways (storage/safetensors_format.h) and the export's
// file plan (storage/safetensors_export.h): headers round-trip, each bad header gets
// its code naming the file and tensor, and every tensor lands in exactly one file.
#include <gtest/gtest.h>

#include <set>

#include "storage/safetensors_export.h"
#include "storage/safetensors_format.h"

namespace tessera::storage {
namespace {

const std::string kFile = "/models/x.safetensors";

Result<SafetensorsHeader> Parse(const std::string& file) {
  ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsPrefix(std::string_view(file).substr(0, 8), file.size(), kFile));
  return ParseSafetensorsHeader(std::string_view(file).substr(8, n), file.size(), kFile);
}

// A file of `json` as its header and `body` bytes after it.
std::string File(const std::string& json, size_t body) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(json.size()) >> (8 * i));
  return out + json + std::string(body, '\0');
}

TEST(Safetensors, HeadersRoundTrip) {
  const std::vector<SafetensorsEntry> entries{{"w", DType::kBFloat16, {2, 3}, 12},
                                              {"step", DType::kInt64, {}, 8},
                                              {"none", DType::kFloat32, {0, 4}, 0}};
  const std::string header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  EXPECT_EQ((header.size() - 8) % 8, 0u);  // padded
  auto h = Parse(header + std::string(20, '\x7f'));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 3u);
  std::map<std::string, SafetensorsTensor> by_name;
  for (const auto& t : h->tensors) by_name[t.name] = t;
  EXPECT_EQ(by_name["w"].dtype, DType::kBFloat16);
  EXPECT_EQ(by_name["w"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(by_name["w"].offset, header.size());
  EXPECT_EQ(by_name["step"].offset, header.size() + 12);
  EXPECT_EQ(h->metadata["format"], "pt");
}

TEST(Safetensors, BadHeadersNameTheFileAndTensor) {
  struct Case {
    std::string file;
    Code code;
    std::string tensor;
  };
  const std::string huge(8, '\0');
  std::string over = huge;
  over[3] = 0x10;  // 256 MiB
  const std::vector<Case> cases = {
      {"abc", Code::kDataLoss, ""},
      {File("{}", 0).replace(0, 1, "\x40"), Code::kDataLoss, ""},  // size past the end
      {over + std::string(100, ' '), Code::kInvalidArgument, ""},
      {File("not json", 0), Code::kDataLoss, ""},
      {File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       Code::kDataLoss, "b"},
      {File(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), Code::kDataLoss, "a"},
      {File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), Code::kDataLoss, "a"},
      {File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), Code::kDataLoss, "a"},
      {File(R"({"a":{"dtype":"U32","shape":[1],"data_offsets":[0,4]}})", 4), Code::kInvalidArgument, "a"},
      {File(R"({"a":{"dtype":"X","shape":[1],"data_offsets":[0,4]}})", 4), Code::kInvalidArgument, "a"},
      {File(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), Code::kDataLoss, "a"},
      {File(R"({"../a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), Code::kInvalidArgument, "../a"},
      {File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"k":1}})", 4), Code::kDataLoss, ""},
  };
  for (const Case& c : cases) {
    auto h = Parse(c.file);
    ASSERT_FALSE(h.ok()) << c.file;
    EXPECT_EQ(h.status().code(), c.code) << h.status().ToString();
    EXPECT_EQ(h.status().details().value("file", ""), kFile) << h.status().ToString();
    EXPECT_EQ(h.status().details().value("tensor", ""), c.tensor) << h.status().ToString();
    EXPECT_NE(h.status().message().find(kFile), std::string::npos) << h.status().ToString();
  }
}

std::vector<TensorMeta> Tensors(const std::vector<int64_t>& sizes) {
  std::vector<TensorMeta> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back({"t" + std::to_string(i), DType::kUInt8, {sizes[i]}, Layout{{"unsharded"}}});
  }
  return out;
}

void ExpectEachTensorOnce(const std::vector<ExportFile>& files, size_t tensors) {
  std::set<std::string> seen;
  for (const auto& f : files) {
    for (const auto& t : f.tensors) EXPECT_TRUE(seen.insert(t).second) << t;
  }
  EXPECT_EQ(seen.size(), tensors);
}

TEST(Safetensors, ExportFilesKeepUnderTheLimitWithEachTensorOnce) {
  const auto tensors = Tensors({40, 40, 30, 100, 5});
  auto in_order = PlanExportFiles(tensors, 80);
  ASSERT_EQ(in_order.size(), 4u);  // {40,40} {30} {100 alone} {5}
  EXPECT_EQ(in_order[0].name, "model-00001-of-00004.safetensors");
  EXPECT_EQ(in_order[0].tensors, (std::vector<std::string>{"t0", "t1"}));
  EXPECT_EQ(in_order[2].tensors, (std::vector<std::string>{"t3"}));
  ExpectEachTensorOnce(in_order, 5);
  EXPECT_EQ(PlanExportFiles(tensors, 1000).size(), 1u);
  EXPECT_EQ(PlanExportFiles(tensors, 1000)[0].name, "model.safetensors");
  // Spread over 3 writers: 3 balanced files, each under the limit unless alone.
  auto spread = PlanExportFiles(tensors, 1000, 3);
  ASSERT_EQ(spread.size(), 3u);
  ExpectEachTensorOnce(spread, 5);
  for (const auto& f : spread) EXPECT_LE(f.bytes, 100u);
  auto capped = PlanExportFiles(tensors, 80, 2);
  ExpectEachTensorOnce(capped, 5);
  for (const auto& f : capped) EXPECT_TRUE(f.bytes <= 80 || f.tensors.size() == 1) << f.name;
  EXPECT_EQ(PlanExportFiles(Tensors({7}), 1000, 4).size(), 1u);  // one tensor, one file
  EXPECT_TRUE(PlanExportFiles({}, 1000, 4).empty());
}

}  // namespace
}  // namespace tessera::storage
