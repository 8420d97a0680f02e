#include <gtest/gtest.h>

#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/names.h"
#include "api/status.h"

namespace tessera {
namespace {

TEST(Status, CodesMapToApiNamesAndHttp) {
  EXPECT_EQ(CodeName(Code::kInvalidArgument), "invalid_argument");
  EXPECT_EQ(HttpStatus(Code::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatus(Code::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatus(Code::kNotFound), 404);
  EXPECT_EQ(HttpStatus(Code::kConflict), 409);
  EXPECT_EQ(HttpStatus(Code::kPayloadTooLarge), 413);
  EXPECT_EQ(HttpStatus(Code::kUnavailable), 503);
  EXPECT_EQ(HttpStatus(Code::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatus(Code::kDataLoss), 500);
  EXPECT_EQ(HttpStatus(Code::kResourceExhausted), 507);
  EXPECT_EQ(HttpStatus(Code::kInternal), 500);
  for (Code c : {Code::kDataLoss, Code::kConflict, Code::kResourceExhausted}) {
    EXPECT_EQ(CodeFromName(CodeName(c)), c);
  }
}

TEST(Status, ErrorBodyFollowsApi) {
  Status st = InvalidArgument("bad", {{"field", "step"}});
  Json body = ErrorBody(st);
  EXPECT_EQ(body["error"]["code"], "invalid_argument");
  EXPECT_EQ(body["error"]["message"], "bad");
  EXPECT_EQ(body["error"]["details"]["field"], "step");
  EXPECT_TRUE(ErrorBody(Internal("x"))["error"]["details"].is_object());
}

TEST(Status, ErrnoMapsDiskFullToResourceExhausted) {
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write", "/x").code(), Code::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(ENOENT, "open", "/x").code(), Code::kNotFound);
  EXPECT_EQ(ErrnoStatus(EIO, "write", "/x").details()["file"], "/x");
}

TEST(Result, AssignOrReturnPropagates) {
  auto f = [](bool ok) -> Result<int> {
    if (!ok) return NotFound("nope");
    return 7;
  };
  auto g = [&](bool ok) -> Result<int> {
    ASSIGN_OR_RETURN(int v, f(ok));
    return v + 1;
  };
  EXPECT_EQ(*g(true), 8);
  EXPECT_EQ(g(false).status().code(), Code::kNotFound);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(AllDTypes().size(), 10u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  for (DType d : AllDTypes()) EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  auto bad = ParseDType("float8", "dtype");
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().details()["field"], "dtype");
}

TEST(Shape, ParseAndPrint) {
  EXPECT_EQ(*ParseShape("8,4"), (Shape{8, 4}));
  EXPECT_EQ(*ParseShape(""), Shape{});
  EXPECT_EQ(ShapeToString({8, 4}), "8,4");
  for (const char* bad : {"8,", ",4", "a", "-1", "8,,4", "1.5", "99999999999999999999"}) {
    EXPECT_FALSE(ParseShape(bad).ok()) << bad;
  }
}

TEST(Names, ApiRules) {
  for (std::string ok : {std::string("a"), std::string("model/layer.0/w"), std::string("A-b_c.d"),
                         std::string(200, 'x')}) {
    EXPECT_TRUE(ValidateName(ok).ok()) << ok;
  }
  for (std::string bad : {std::string(), std::string(201, 'x'), std::string("/abs"),
                          std::string("a/../b"), std::string(".."), std::string("a b"),
                          std::string("a\\b"), std::string("a//b"), std::string("a/"),
                          std::string("a/./b"), std::string("é"), std::string("a\0b", 3)}) {
    Status st = ValidateName(bad, "tensor");
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(st.details()["field"], "tensor");
  }
}

Mesh M22() { return Mesh{"m", {{"data", 2}, {"model", 2}}, 1}; }

TEST(Mesh, DeviceCoordsAreRowMajorLastAxisFastest) {
  Mesh m = M22();
  EXPECT_EQ(m.num_devices(), 4);
  EXPECT_EQ(m.DeviceCoords(3), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(m.DeviceCoords(1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(m.DeviceCoords(2), (std::vector<int64_t>{1, 0}));
  Mesh two{"m", {{"data", 2}, {"model", 2}}, 2};
  EXPECT_EQ(two.WorkerOfDevice(3), 1);
  EXPECT_EQ(two.num_workers(), 2);
}

TEST(Mesh, ValidationNamesTheField) {
  Mesh m = M22();
  EXPECT_TRUE(m.Validate().ok());
  m.devices_per_worker = 3;
  EXPECT_EQ(m.Validate().details()["field"], "devices_per_worker");
  m = M22();
  m.axes[1].name = "data";
  EXPECT_EQ(m.Validate().details()["field"], "axes[1].name");
  m = M22();
  m.axes[0].size = 0;
  EXPECT_EQ(m.Validate().details()["field"], "axes[0].size");
  m = M22();
  m.name = "../x";
  EXPECT_EQ(m.Validate().details()["field"], "mesh");
}

TEST(Layout, ValidationAndSlices) {
  Mesh m = M22();
  Shape shape{8, 4};
  Layout l{{"data", "model"}};
  ASSERT_TRUE(ValidateLayout(m, l, shape).ok());
  EXPECT_EQ(DeviceSlice(m, l, shape, 3), (SliceSpec{{4, 2}, {4, 2}}));
  EXPECT_EQ(DeviceSlice(m, l, shape, 1), (SliceSpec{{0, 2}, {4, 2}}));
  EXPECT_EQ(LocalShape(m, l, shape), (Shape{4, 2}));
  // Indivisible dimension: a clear error naming the dimension.
  Status st = ValidateLayout(m, Layout{{"data", "unsharded"}}, {7, 4});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not divisible"), std::string::npos);
  EXPECT_EQ(st.details()["dimension"], 0);
  EXPECT_FALSE(ValidateLayout(m, Layout{{"data"}}, shape).ok());                 // rank
  EXPECT_FALSE(ValidateLayout(m, Layout{{"data", "data"}}, shape).ok());         // reuse
  EXPECT_FALSE(ValidateLayout(m, Layout{{"batch", "unsharded"}}, shape).ok());   // unknown
}

TEST(Layout, DistinctSlicesDeduplicateReplicas) {
  Mesh m = M22();
  auto rep = DistinctSlices(m, Layout::Replicated(2), {8, 4});
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].devices, (std::vector<int64_t>{0, 1, 2, 3}));
  auto half = DistinctSlices(m, Layout{{"data", "unsharded"}}, {8, 4});
  ASSERT_EQ(half.size(), 2u);
  EXPECT_EQ(half[0].devices, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(half[1].devices, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(DistinctSlices(m, Layout{{"data", "model"}}, {8, 4}).size(), 4u);
  auto scalar = DistinctSlices(m, Layout{}, {});
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_EQ(scalar[0].slice.NumElements(), 1);
}

TEST(Slices, IntersectAndContain) {
  SliceSpec a{{0, 0}, {4, 4}}, b{{2, 2}, {4, 4}}, c{{4, 0}, {1, 1}};
  EXPECT_EQ(*Intersect(a, b), (SliceSpec{{2, 2}, {2, 2}}));
  EXPECT_FALSE(Intersect(a, c).has_value());
  EXPECT_TRUE(Contains(a, SliceSpec{{1, 1}, {2, 2}}));
  EXPECT_FALSE(Contains(a, b));
}

TEST(JsonCodec, MeshRoundTripAndErrors) {
  Mesh m = M22();
  EXPECT_EQ(*MeshFromJson(MeshToJson(m)), m);
  auto j = *ParseJson(R"({"axes":[{"name":"data","size":"2"}]})");
  auto bad = MeshFromJson(j, std::string("m"));
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().details()["field"], "size");
  EXPECT_FALSE(MeshFromJson(*ParseJson("[]")).ok());
  EXPECT_FALSE(MeshFromJson(*ParseJson(R"({"axes":5})"), std::string("m")).ok());
  EXPECT_FALSE(ParseJson("{\"a\":").ok());
  EXPECT_NE(ParseJson("{\"a\":").status().message().find("malformed JSON"), std::string::npos);
}

TEST(JsonCodec, LayoutAcceptsNullAsUnsharded) {
  auto l = LayoutFromJson(*ParseJson(R"(["data", null, "unsharded"])"));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->dims, (std::vector<std::string>{"data", "unsharded", "unsharded"}));
  EXPECT_FALSE(LayoutFromJson(*ParseJson(R"(["data", 3])")).ok());
  EXPECT_FALSE(LayoutFromJson(*ParseJson(R"("data")")).ok());
  EXPECT_EQ(*ParseLayout("data,unsharded"), (Layout{{"data", "unsharded"}}));
  EXPECT_FALSE(ParseLayout("data,,x").ok());
}

TEST(JsonCodec, FieldReaders) {
  Json j = *ParseJson(R"({"step": 5, "name": "x", "flag": true, "neg": "5"})");
  EXPECT_EQ(*RequiredInt(j, "step"), 5);
  EXPECT_EQ(RequiredInt(j, "missing").status().details()["field"], "missing");
  EXPECT_EQ(RequiredInt(j, "neg").status().details()["field"], "neg");
  EXPECT_EQ(**OptionalString(j, "name"), "x");
  EXPECT_FALSE(OptionalString(j, "step").ok());
  EXPECT_TRUE(**OptionalBool(j, "flag"));
  EXPECT_FALSE(OptionalInt(j, "nothing")->has_value());
}

}  // namespace
}  // namespace tessera
