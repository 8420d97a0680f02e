#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "api/dtype.h"
#include "http/router.h"
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

TEST(Status, ErrorJsonRoundTrips) {
  Status st = DataLoss("chunk 3 of shard-0.tsr", {{"file", "shard-0.tsr"}});
  for (const Json& j : {ErrorBody(st), ErrorBody(st)["error"]}) {
    Status back = StatusFromErrorJson(j);
    EXPECT_EQ(back.code(), Code::kDataLoss);
    EXPECT_EQ(back.message(), st.message());
    EXPECT_EQ(back.details()["file"], "shard-0.tsr");
  }
  // Unreadable errors, and an error that claims to be ok, become internal errors.
  for (const Json& j : {Json(nullptr), Json("x"), Json::array(), Json{{"error", 3}},
                        Json{{"code", "ok"}, {"message", "fine"}}}) {
    Status back = StatusFromErrorJson(j, "task failed");
    EXPECT_EQ(back.code(), Code::kInternal) << j;
    EXPECT_FALSE(back.message().empty()) << j;
  }
  EXPECT_EQ(StatusFromErrorJson(Json::object(), "task failed").message(), "task failed");
  EXPECT_EQ(StatusFromErrorJson(Json{{"code", 5}}).code(), Code::kInternal);
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

TEST(JsonCodec, StrictParsingRefusesARepeatedKeyNamingIt) {
  // ParseJson keeps the last value; a request body must not say two things.
  EXPECT_EQ((*ParseJson(R"({"step": 1, "step": 2})"))["step"], 2);
  auto dup = ParseStrictJson(R"({"tensors": ["a"], "meta": {"x": 1, "y": 2, "x": 3}})");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(dup.status().details()["key"], "x");
  EXPECT_NE(dup.status().message().find("repeats the key 'x'"), std::string::npos);
  // The same key in sibling objects, or in an object inside an array, is fine.
  auto ok = ParseStrictJson(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)["c"][1]["x"], 2);
  EXPECT_FALSE(ParseStrictJson("{\"a\":").ok());
}

TEST(JsonCodec, AMeshHasAtMost32Axes) {
  Json axes = Json::array();
  for (int i = 0; i < 33; ++i) axes.push_back({{"name", "a" + std::to_string(i)}, {"size", 1}});
  auto many = MeshFromJson(Json{{"axes", axes}}, std::string("m"));
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.status().details()["field"], "axes");
  axes.erase(axes.size() - 1);
  EXPECT_TRUE(MeshFromJson(Json{{"axes", axes}}, std::string("m")).ok());
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

// Regressions found by the fuzz targets of fuzz/ (their inputs are in
// fuzz/corpus/*/regress-*).

TEST(FuzzRegression, MeshDeviceCountOverflowIsRefused) {
  // 65536^4 devices overflowed int64 before the 2^20 limit was checked.
  Mesh m{"m", {{"a", 65536}, {"b", 65536}, {"c", 65536}, {"d", 65536}}, 1};
  Status st = m.Validate();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.details()["field"], "axes");
  EXPECT_FALSE(MeshFromJson(MeshToJson(m)).ok());
  EXPECT_TRUE((Mesh{"m", {{"a", 1024}, {"b", 1024}}, 1}).Validate().ok());
}

TEST(FuzzRegression, DimensionsAboveTheElementLimitAreRefused) {
  // With a zero dimension the product stays 0, and offset + length of a slice
  // overflowed (SliceSpec::ToString, Contains, Intersect).
  for (const char* bad : {"0,9223372036854775807", "0,281474976710657"}) {
    auto st = ParseShape(bad, "offsets").status();
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(st.details()["field"], "offsets");
  }
  EXPECT_TRUE(ParseShape("0,281474976710656").ok());
  // The non-zero dims' product is bounded too: a sparse call's row (dense_shape
  // past its first dim) overflowed with a first dim of 0.
  for (const char* bad : {"0,51615,80000000,103230", "0,16777216,16777217"}) {
    auto st = ParseShape(bad, "dense_shape").status();
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(st.details()["field"], "dense_shape");
  }
  EXPECT_TRUE(ParseShape("0,16777216,16777216").ok());
  auto slice = SliceFromJson(*ParseJson(R"({"offsets":[0,9223372036854775807],"lengths":[0,9223372036854775807]})"));
  EXPECT_EQ(slice.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(slice.status().details()["field"], "slice.offsets");
}

TEST(FuzzRegression, DeeplyNestedJsonIsRefused) {
  // Copying or printing a value recurses per level: a 2 MiB body of brackets
  // overflowed the stack wherever a handler copied it.
  const int n = 1000000;
  auto deep = ParseJson("{\"metadata\":" + std::string(n, '[') + std::string(n, ']') + "}");
  EXPECT_EQ(deep.status().code(), Code::kInvalidArgument);
  EXPECT_NE(deep.status().message().find("deeper than"), std::string::npos);
  EXPECT_EQ(deep.status().details()["field"], "request body");
  auto at_limit = ParseJson(std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']'));
  ASSERT_TRUE(at_limit.ok());
  Json copy = *at_limit;
  EXPECT_EQ(copy, *at_limit);
  EXPECT_FALSE(ParseJson(std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']')).ok());
  // Brackets inside strings do not count.
  EXPECT_TRUE(ParseJson("[\"" + std::string(10000, '[') + "\\\"\"]").ok());
}

TEST(FuzzRegression, IntegersAbove2To63AreRefused) {
  // 18446744073709551615 was read as -1.
  Json j = *ParseJson(R"({"step": 18446744073709551615, "ok": 9223372036854775807})");
  auto step = OptionalInt(j, "step");
  EXPECT_EQ(step.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(step.status().details()["field"], "step");
  EXPECT_EQ(*RequiredInt(j, "ok"), INT64_MAX);
}

TEST(FuzzRegression, PercentDecodeTakesOnlyTwoHexDigits) {
  // from_chars also took a sign: "%-1" decoded to 0xff and "%-0" to NUL.
  for (const char* kept : {"%-1", "%-0", "%+1", "% 1", "%1", "%", "%g0", "%0x"}) {
    EXPECT_EQ(http::PercentDecode(kept), kept);
  }
  EXPECT_EQ(http::PercentDecode("a%2Fb%2fc%41"), "a/b/cA");
  EXPECT_EQ(http::PercentDecode(http::PercentEncodeSegment("%-1/x y")), "%-1/x y");
}

TEST(FuzzRegression, LongPathsRouteInLinearTime) {
  // Every candidate value of a {name+} parameter was decoded before the rest
  // of the pattern was tried: an 8 KiB path cost seconds per greedy route.
  http::Router router;
  for (const char* p : {"/api/v1/meshes/{m+}/checkpoints", "/api/v1/meshes/{m+}/checkpoints/{step}",
                        "/api/v1/meshes/{m+}/preemption/sync", "/api/v1/meshes/{name+}"}) {
    router.Add({"GET", p, [](const http::Request& req) {
                  return http::Response::Json(200, {{"m", req.Param("m")}, {"name", req.Param("name")},
                                                    {"step", req.Param("step")}});
                }, ""});
  }
  http::Request req;
  req.method = "POST";
  req.path = "/api/v1/meshes/";
  for (int i = 0; i < 32000; ++i) req.path += "a/";
  req.path += "x";
  EXPECT_EQ(router.Dispatch(req).status, 405);
  // Counted, not timed: steps and decoded segments stay within a few per segment per route.
  bool wrong_method = false;
  size_t work = 0;
  EXPECT_EQ(router.Match(&req, &wrong_method, &work), nullptr);
  EXPECT_TRUE(wrong_method);
  EXPECT_LE(work, 4u * 4u * 32003u) << "route matching is not linear in the path";

  // Matching itself is unchanged: the longest value that lets the rest match,
  // never across an empty segment.
  req.method = "GET";
  req.path = "/api/v1/meshes/a/b%2Fc/checkpoints/7";
  auto r = ParseJson(router.Dispatch(req).body);
  EXPECT_EQ((*r)["m"], "a/b/c");
  EXPECT_EQ((*r)["step"], "7");
  req.path = "/api/v1/meshes/a//b/checkpoints";
  EXPECT_EQ(router.Dispatch(req).status, 404);
  req.path = "/api/v1/meshes/a/checkpoints/x/y";
  EXPECT_EQ((*ParseJson(router.Dispatch(req).body))["name"], "a/checkpoints/x/y");
}

}  // namespace
}  // namespace tessera
