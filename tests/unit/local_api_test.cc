#include "worker/local_api.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "http/client.h"
#include "http/server.h"

namespace tessera::worker {
namespace {

using http::Request;
using http::Response;

// This worker is rank 1 of {data:2, model:2} with two devices each: it owns 2 and 3.
Result<MeshPlacement> Resolve(const std::string& mesh) {
  if (mesh != "m") return NotFound("unknown mesh '" + mesh + "'", {{"mesh", mesh}});
  return MeshPlacement{Mesh{"m", {{"data", 2}, {"model", 2}}, 2}, 1, {2, 3}, {}};
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 17 + i / 251) & 0xff);
  return s;
}

using Query = std::multimap<std::string, std::string>;

// float32[8,4] over data: a local shard is [4,4], 64 bytes.
Query Matrix(const std::string& device = "2") {
  return {{"mesh", "m"},
          {"device", device},
          {"dtype", "float32"},
          {"shape", "8,4"},
          {"layout", "data,unsharded"}};
}

class LocalApiTest : public ::testing::Test {
 protected:
  LocalApiTest() {
    TensorStoreOptions options;
    options.shm_prefix = "tessera-apitest-" + std::to_string(getpid());
    store_ = std::make_unique<TensorStore>(Resolve, options);
    router_ = std::make_shared<http::Router>();
    AddTensorRoutes(router_.get(), store_.get());
  }

  Response Call(const std::string& method, const std::string& path, Query query = {},
                std::string body = "") {
    Request req;
    req.method = method;
    req.path = path;
    req.query = std::move(query);
    req.body = std::move(body);
    return router_->Dispatch(std::move(req));
  }

  // Asserts a docs/openapi-worker.json error body with `code` and details.field == `field`.
  void ExpectError(const Response& res, int status, const std::string& code,
                   const std::string& field = "") {
    EXPECT_EQ(res.status, status) << res.body;
    Json body = Json::parse(res.body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << res.body;
    EXPECT_EQ(body["error"]["code"], code) << res.body;
    if (!field.empty()) {
      EXPECT_EQ(body["error"]["details"]["field"], field) << res.body;
    }
  }

  static std::string Header(const Response& res, const std::string& name) {
    for (const auto& [k, v] : res.headers) {
      if (k == name) return v;
    }
    return "<absent>";
  }

  std::unique_ptr<TensorStore> store_;
  std::shared_ptr<http::Router> router_;
};

TEST_F(LocalApiTest, PutGetListDelete) {
  const std::string bytes = Pattern(64, 1);
  Response put = Call("PUT", "/v1/tensors/dense/kernel", Matrix(), bytes);
  EXPECT_EQ(put.status, 204) << put.body;
  EXPECT_EQ(Call("PUT", "/v1/tensors/dense/kernel", Matrix("3"), Pattern(64, 2)).status, 204);

  Response get = Call("GET", "/v1/tensors/dense/kernel", {{"mesh", "m"}, {"device", "2"}});
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.content_type, "application/octet-stream");
  EXPECT_EQ(get.body, bytes);
  EXPECT_EQ(Header(get, "X-Tessera-Dtype"), "float32");
  EXPECT_EQ(Header(get, "X-Tessera-Shape"), "8,4");
  EXPECT_EQ(Header(get, "X-Tessera-Layout"), "data,unsharded");
  EXPECT_EQ(Header(get, "X-Tessera-Local-Shape"), "4,4");

  // A '/' inside the name may also come percent-encoded.
  Response encoded = Call("GET", "/v1/tensors/dense%2Fkernel", {{"mesh", "m"}, {"device", "3"}});
  EXPECT_EQ(encoded.status, 200);
  EXPECT_EQ(encoded.body, Pattern(64, 2));

  Response list = Call("GET", "/v1/tensors");
  ASSERT_EQ(list.status, 200);
  Json entries = Json::parse(list.body);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0]["name"], "dense/kernel");
  EXPECT_EQ(entries[0]["mesh"], "m");
  EXPECT_EQ(entries[0]["dtype"], "float32");
  EXPECT_EQ(entries[0]["shape"], Json({8, 4}));
  EXPECT_EQ(entries[0]["layout"], Json({"data", "unsharded"}));
  EXPECT_EQ(entries[0]["devices"], Json({2, 3}));
  EXPECT_EQ(entries[0]["mapped"], false);

  EXPECT_EQ(Call("DELETE", "/v1/tensors/dense/kernel", {{"mesh", "m"}}).status, 204);
  ExpectError(Call("GET", "/v1/tensors/dense/kernel", {{"mesh", "m"}, {"device", "2"}}), 404,
              "not_found");
  ExpectError(Call("DELETE", "/v1/tensors/dense/kernel", {{"mesh", "m"}}), 404, "not_found");
  EXPECT_EQ(Json::parse(Call("GET", "/v1/tensors").body), Json::array());
}

TEST_F(LocalApiTest, ScalarHasEmptyShapeAndLayout) {
  Query q{{"mesh", "m"}, {"device", "3"}, {"dtype", "int64"}, {"shape", ""}, {"layout", ""}};
  EXPECT_EQ(Call("PUT", "/v1/tensors/step", q, Pattern(8, 4)).status, 204);
  Response get = Call("GET", "/v1/tensors/step", {{"mesh", "m"}, {"device", "3"}});
  EXPECT_EQ(get.body, Pattern(8, 4));
  EXPECT_EQ(Header(get, "X-Tessera-Shape"), "");
  EXPECT_EQ(Header(get, "X-Tessera-Local-Shape"), "");
}

TEST_F(LocalApiTest, MappingRoute) {
  Response res = Call("POST", "/v1/tensors/opt/adam/m/mapping", Matrix("3"));
  ASSERT_EQ(res.status, 200) << res.body;
  Json body = Json::parse(res.body);
  const std::string path = body["path"];
  EXPECT_EQ(body["bytes"], 64);
  EXPECT_EQ(body["local_shape"], Json({4, 4}));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);

  // The name is "opt/adam/m", not "opt/adam/m/mapping"; a PUT lands in the file.
  EXPECT_EQ(Call("PUT", "/v1/tensors/opt/adam/m", Matrix("3"), Pattern(64, 6)).status, 204);
  std::ifstream in(path, std::ios::binary);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, Pattern(64, 6));
  Json list = Json::parse(Call("GET", "/v1/tensors").body);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["name"], "opt/adam/m");
  EXPECT_EQ(list[0]["mapped"], true);

  // A tensor may itself be called ".../mapping" and is still readable.
  EXPECT_EQ(Call("PUT", "/v1/tensors/x/mapping", Matrix(), Pattern(64, 0)).status, 204);
  EXPECT_EQ(Call("GET", "/v1/tensors/x/mapping", {{"mesh", "m"}, {"device", "2"}}).status, 200);

  ExpectError(Call("POST", "/v1/tensors/opt/adam/m/mapping", {{"mesh", "m"}, {"device", "3"}}), 400,
              "invalid_argument", "dtype");
  Query half = Matrix("3");
  half.find("dtype")->second = "float16";
  ExpectError(Call("POST", "/v1/tensors/opt/adam/m/mapping", half), 409, "conflict");

  EXPECT_EQ(Call("DELETE", "/v1/tensors/opt/adam/m", {{"mesh", "m"}}).status, 204);
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

TEST_F(LocalApiTest, EveryParameterIsChecked) {
  const std::string bytes = Pattern(64, 1);
  for (const char* field : {"mesh", "device", "dtype", "shape", "layout"}) {
    Query q = Matrix();
    q.erase(field);
    ExpectError(Call("PUT", "/v1/tensors/w", q, bytes), 400, "invalid_argument", field);
    ExpectError(Call("POST", "/v1/tensors/w/mapping", q), 400, "invalid_argument", field);
  }
  const std::map<std::string, std::string> malformed = {
      {"device", "two"}, {"dtype", "float8"}, {"shape", "8,,4"}, {"layout", "data,"}};
  for (const auto& [field, value] : malformed) {
    Query q = Matrix();
    q.find(field)->second = value;
    ExpectError(Call("PUT", "/v1/tensors/w", q, bytes), 400, "invalid_argument", field);
  }
  ExpectError(Call("GET", "/v1/tensors/w", {{"device", "2"}}), 400, "invalid_argument", "mesh");
  ExpectError(Call("GET", "/v1/tensors/w", {{"mesh", "m"}}), 400, "invalid_argument", "device");
  ExpectError(Call("GET", "/v1/tensors/w", {{"mesh", "m"}, {"device", "2x"}}), 400,
              "invalid_argument", "device");
  ExpectError(Call("DELETE", "/v1/tensors/w"), 400, "invalid_argument", "mesh");

  ExpectError(Call("PUT", "/v1/tensors/w", Matrix(), bytes + "x"), 400, "invalid_argument", "body");
  ExpectError(Call("PUT", "/v1/tensors/w", Matrix("0"), bytes), 400, "invalid_argument", "device");
  Query indivisible = Matrix();
  indivisible.find("shape")->second = "7,4";
  ExpectError(Call("PUT", "/v1/tensors/w", indivisible, bytes), 400, "invalid_argument", "layout");
  ExpectError(Call("PUT", "/v1/tensors/a%20b", Matrix(), bytes), 400, "invalid_argument", "name");
  ExpectError(Call("PUT", "/v1/tensors/a/../b", Matrix(), bytes), 400, "invalid_argument", "name");
  Query other_mesh = Matrix();
  other_mesh.find("mesh")->second = "other";
  ExpectError(Call("PUT", "/v1/tensors/w", other_mesh, bytes), 404, "not_found");
  ExpectError(Call("GET", "/v1/tensors/nope", {{"mesh", "m"}, {"device", "2"}}), 404, "not_found");

  ASSERT_EQ(Call("PUT", "/v1/tensors/w", Matrix(), bytes).status, 204);
  Query half = Matrix();
  half.find("dtype")->second = "float16";
  ExpectError(Call("PUT", "/v1/tensors/w", half, bytes.substr(0, 32)), 409, "conflict");
  ExpectError(Call("GET", "/v1/tensors/w", {{"mesh", "m"}, {"device", "3"}}), 404, "not_found");
  EXPECT_EQ(Call("PATCH", "/v1/tensors/w", Matrix()).status, 405);
  EXPECT_TRUE(store_->List().size() == 1);
}

TEST_F(LocalApiTest, OverARealSocket) {
  http::ServerOptions options;
  options.port = 0;
  options.threads = 4;
  http::Server server(router_, options);
  auto port = server.Bind();
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  server.Start();
  auto owned_client = std::make_unique<http::Client>("http://127.0.0.1:" + std::to_string(*port));
  http::Client& client = *owned_client;

  // float32[2048,4096] over data: the local shard is 1024 x 4096 x 4 bytes = 16 MiB.
  const std::string bytes = Pattern(size_t{16} << 20, 3);
  auto put = client.Send("PUT",
                         "/v1/tensors/" + http::PercentEncode("big/w") +
                             "?mesh=m&device=3&dtype=float32&shape=2048,4096&layout=data,unsharded",
                         bytes, "application/octet-stream");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->status, 204) << put->body;
  auto get = client.Send("GET", "/v1/tensors/big%2Fw?mesh=m&device=3");
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->status, 200);
  EXPECT_TRUE(get->body == bytes);
  EXPECT_EQ(get->headers["X-Tessera-Local-Shape"], "1024,4096");
  EXPECT_EQ(get->headers["X-Tessera-Shape"], "2048,4096");
  EXPECT_EQ(get->headers["Content-Type"], "application/octet-stream");

  // Empty query values (a scalar) survive the trip; errors are docs/openapi-worker.json bodies.
  auto scalar = client.Send("PUT", "/v1/tensors/step?mesh=m&device=2&dtype=int32&shape=&layout=",
                            Pattern(4, 0), "application/octet-stream");
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->status, 204) << scalar->body;
  auto missing = client.Call("GET", "/v1/tensors/step?device=2");
  EXPECT_EQ(missing.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(missing.status().details()["field"], "mesh");
  auto list = client.Call("GET", "/v1/tensors");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);

  // curl --data-binary @file says its body is a form; the bytes are taken as they are.
  const std::string form_bytes = Pattern(128 * 1024 * 4, 9);  // float32[128,1024] local of [256,1024]
  auto form = client.Send("PUT", "/v1/tensors/f?mesh=m&device=3&dtype=float32&shape=256,1024"
                                 "&layout=data,unsharded",
                          form_bytes, "application/x-www-form-urlencoded");
  ASSERT_TRUE(form.ok());
  EXPECT_EQ(form->status, 204) << form->body;
  auto back = client.Send("GET", "/v1/tensors/f?mesh=m&device=3");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->body == form_bytes);
  // A multipart form is refused as such (400 naming the Content-Type), not a crash.
  auto multipart = client.Send("PUT", "/v1/tensors/g?mesh=m&device=3&dtype=float32&shape=4&layout=unsharded",
                               "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1234\r\n--b--\r\n",
                               "multipart/form-data; boundary=b");
  ASSERT_TRUE(multipart.ok());
  EXPECT_EQ(multipart->status, 400) << multipart->body;
  EXPECT_EQ(Json::parse(multipart->body)["error"]["details"]["field"], "content-type");
  owned_client.reset();  // an idle keep-alive connection would hold Stop() for 5 s
  server.Stop();
}

}  // namespace
}  // namespace tessera::worker
