// The REST references in docs/ held to the route tables: every route of tesserad is an
// operation of docs/openapi.json (and tesserad serves that document), every route of the
// worker's local API is one of docs/openapi-worker.json, and neither lists a route that
// does not exist. Operations name their route in "x-tessera-route".
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "api/collective_ops.h"
#include "service/dashboard.h"
#include "service/openapi.h"
#include "service/service.h"
#include "storage/env.h"
#include "worker/local_routes.h"

namespace tessera {
namespace {

using Routes = std::set<std::pair<std::string, std::string>>;  // (METHOD, pattern)

Routes RoutesOf(const http::Router& router) {
  Routes out;
  for (const auto& r : router.routes()) out.emplace(r.method, r.pattern);
  return out;
}

// "/a/{m+}/b" → "/a/{m}/b": OpenAPI has no multi-segment parameters.
std::string OpenApiPath(const std::string& pattern) {
  std::string out = pattern;
  for (size_t p = out.find("+}"); p != std::string::npos; p = out.find("+}")) out.erase(p, 1);
  return out;
}

// Checks `doc` against `routes`; returns the operations by route.
void ExpectDocumentsExactly(const Json& doc, const Routes& routes, const std::string& what) {
  ASSERT_TRUE(doc.is_object()) << what;
  EXPECT_EQ(doc.value("openapi", "").substr(0, 2), "3.") << what;
  Routes documented;
  std::set<std::string> operation_ids;
  for (const auto& [path, item] : doc["paths"].items()) {
    for (const auto& [method, op] : item.items()) {
      if (method == "parameters") continue;
      const std::string route = op.value("x-tessera-route", "");
      std::string upper = method;
      for (char& c : upper) c = static_cast<char>(std::toupper(c));
      EXPECT_FALSE(route.empty()) << what << ": " << upper << " " << path << " names no route";
      EXPECT_EQ(OpenApiPath(route), path) << what << ": " << upper << " " << path;
      EXPECT_TRUE(operation_ids.insert(op.value("operationId", "")).second)
          << what << ": operationId of " << upper << " " << path << " is missing or repeated";
      EXPECT_TRUE(op.contains("responses")) << what << ": " << upper << " " << path;
      documented.emplace(upper, route);
    }
  }
  for (const auto& r : routes) {
    EXPECT_TRUE(documented.count(r)) << what << " lacks " << r.first << " " << r.second;
  }
  for (const auto& d : documented) {
    EXPECT_TRUE(routes.count(d)) << what << " documents " << d.first << " " << d.second
                                 << ", which is no route";
  }
}

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str(), nullptr, false);
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tessera_openapi_test.XXXXXX";
    path_ = ::mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() { (void)storage::DefaultEnv()->DeleteTree(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(OpenApi, TesseradServesAReferenceOfEveryRoute) {
  TempDir dir;
  service::ServiceOptions opts;
  opts.data_dir = dir.path() + "/data";
  opts.checkpoint_root = dir.path() + "/checkpoints";
  auto svc = service::Service::Create(opts, storage::DefaultEnv());
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  http::Router router;
  (*svc)->AddRoutes(&router);
  service::AddDashboardRoutes(&router);

  const Json embedded = Json::parse(service::OpenApiDocument(), nullptr, false);
  ExpectDocumentsExactly(embedded, RoutesOf(router), "docs/openapi.json (embedded)");
  // The embedded copy is the one in the source tree.
  EXPECT_EQ(embedded, ReadJson(std::string(TESSERA_SOURCE_DIR) + "/docs/openapi.json"));

  // Served as JSON, behind the token like every route under /api/v1.
  http::Request req;
  req.method = "GET";
  req.path = "/api/v1/openapi.json";
  bool wrong_method = false;
  const http::Route* route = router.Match(&req, &wrong_method);
  ASSERT_NE(route, nullptr);
  EXPECT_TRUE(route->auth);
  http::Response r = router.Dispatch(req);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(Json::parse(r.body, nullptr, false), embedded);
}

TEST(OpenApi, TheWorkerReferenceListsEveryLocalRoute) {
  worker::TensorStore store(
      [](const std::string& mesh) -> Result<worker::MeshPlacement> { return NotFound(mesh); });
  worker::Agent agent(worker::AgentOptions{}, storage::DefaultEnv());
  http::Router router;
  worker::AddLocalRoutes(&router, &store, &agent, nullptr);
  ExpectDocumentsExactly(ReadJson(std::string(TESSERA_SOURCE_DIR) + "/docs/openapi-worker.json"),
                         RoutesOf(router), "docs/openapi-worker.json");
}

TEST(OpenApi, TheCollectiveOpsAreTheOnesTheCodeKnows) {
  // Every op the worker parses, and the REST ones, as the references list them.
  Json all = ParseCollectiveOp("").status().details()["allowed"];
  Json rest = Json::array();
  for (const Json& op : all) {
    if (IsRestCollective(*ParseCollectiveOp(op.get<std::string>()))) rest.push_back(op);
  }
  ASSERT_GE(rest.size(), 7u);
  const Json worker = ReadJson(std::string(TESSERA_SOURCE_DIR) + "/docs/openapi-worker.json");
  EXPECT_EQ(worker["components"]["schemas"]["CollectiveOp"]["enum"], all);
  const Json service = ReadJson(std::string(TESSERA_SOURCE_DIR) + "/docs/openapi.json");
  EXPECT_EQ(service["components"]["schemas"]["CollectiveRequest"]["properties"]["op"]["enum"], rest);
}

}  // namespace
}  // namespace tessera
