#include "worker/restore_match.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::worker {
namespace {

TensorDesc Desc(DType dtype, Shape shape, std::vector<std::string> layout) {
  return TensorDesc{dtype, std::move(shape), Layout{std::move(layout)}};
}

Json Saved(const std::string& name, DType dtype, Shape shape, std::vector<std::string> layout) {
  return TensorMetaToJson(TensorMeta(name, Desc(dtype, std::move(shape), std::move(layout))));
}

RestoreRequest Request(bool strict = true,
                       std::optional<std::vector<std::string>> names = std::nullopt) {
  return RestoreRequest{"m", 7, "w-a", std::move(names), strict};
}

std::vector<std::string> Names(const Json& tensors) {
  std::vector<std::string> out;
  for (const Json& t : tensors) out.push_back(t["name"].get<std::string>());
  return out;
}

// The checkpoint saved "a" sharded on data, "b" and "c"; this worker holds "a"
// replicated (another layout: restored into it), "b", and "d" that was never saved.
const std::vector<HeldTensor> kHeld = {
    {"a", Desc(DType::kFloat32, {8, 2}, {"unsharded", "unsharded"})},
    {"b", Desc(DType::kInt64, {3}, {"unsharded"})},
    {"d", Desc(DType::kFloat32, {1}, {"unsharded"})},
};
const Json kSaved = Json::array({Saved("a", DType::kFloat32, {8, 2}, {"data", "unsharded"}),
                                 Saved("b", DType::kInt64, {3}, {"unsharded"}),
                                 Saved("c", DType::kFloat32, {4}, {"unsharded"})});

TEST(RestoreMatch, StrictRefusesMissingAndUnexpectedNamesListingBoth) {
  auto r = MatchCheckpoint(Request(), kHeld, kSaved);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kConflict);
  const Json& d = r.status().details();
  EXPECT_EQ(d["missing"], Json::array({"d"}));
  EXPECT_EQ(d["unexpected"], Json::array({"c"}));
  EXPECT_EQ(d["step"], 7);
  EXPECT_EQ(d["worker"], "w-a");
  EXPECT_NE(r.status().message().find("1 attached but not in the checkpoint (d)"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("1 in the checkpoint but not attached (c)"),
            std::string::npos);
}

TEST(RestoreMatch, NotStrictRestoresTheIntersectionInTheHeldLayouts) {
  auto r = MatchCheckpoint(Request(false), kHeld, kSaved);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->missing, std::vector<std::string>{"d"});
  EXPECT_EQ(r->unexpected, std::vector<std::string>{"c"});
  EXPECT_EQ(Names(r->tensors), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r->tensors[0]["dtype"], "float32");
  EXPECT_EQ(r->layouts["a"], LayoutToJson(Layout{{"unsharded", "unsharded"}}));
}

TEST(RestoreMatch, EverythingMatchingRestoresEverything) {
  std::vector<HeldTensor> held(kHeld.begin(), kHeld.begin() + 2);
  held.push_back({"c", Desc(DType::kFloat32, {4}, {"unsharded"})});
  auto r = MatchCheckpoint(Request(), held, kSaved);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->missing.empty() && r->unexpected.empty());
  EXPECT_EQ(Names(r->tensors), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(RestoreMatch, AnotherDtypeOrShapeRefusesEvenWhenNotStrict) {
  std::vector<HeldTensor> held = kHeld;
  held[1].desc.dtype = DType::kInt32;
  for (bool strict : {true, false}) {
    auto r = MatchCheckpoint(Request(strict), held, kSaved);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().details()["tensor"], "b");
    EXPECT_EQ(r.status().details()["mismatched"][0]["checkpoint"], "int64[3] layout [unsharded]")
        << r.status().details().dump();
  }
}

TEST(RestoreMatch, NamedTensorsMustBeSavedAndMayBeNew) {
  auto r = MatchCheckpoint(Request(true, std::vector<std::string>{"b", "c"}), kHeld, kSaved);
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // "c" is not held: the restore creates it
  EXPECT_EQ(Names(r->tensors), (std::vector<std::string>{"b", "c"}));
  EXPECT_FALSE(r->layouts.contains("c"));
  auto missing = MatchCheckpoint(Request(true, std::vector<std::string>{"d"}), kHeld, kSaved);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().details()["missing"], Json::array({"d"}));
}

TEST(RestoreMatch, NamesThatDifferByDdpsPrefixGetAHint) {
  const std::vector<HeldTensor> held = {
      {"model/fc.weight", Desc(DType::kFloat32, {2}, {"unsharded"})}};
  const Json saved =
      Json::array({Saved("model/module.fc.weight", DType::kFloat32, {2}, {"unsharded"})});
  auto r = MatchCheckpoint(Request(), held, saved);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'module.' prefix"), std::string::npos)
      << r.status().message();
}

TEST(RestoreMatch, AnUnreadableRecordIsAnErrorNamingTheCheckpoint) {
  auto r = MatchCheckpoint(Request(), kHeld, Json::array({Json{{"name", "a"}}}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("checkpoint m step 7"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace tessera::worker
