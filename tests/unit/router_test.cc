// The one route table of every HTTP server: pattern matching, parameters, the error
// policy (404, 405, JSON errors) and the adapters from functions to handlers.
#include "http/router.h"

#include <gtest/gtest.h>

namespace tessera::http {
namespace {

Request Req(std::string method, std::string path) {
  Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  return r;
}

// Answers {"route": pattern, "params": {...}}.
Router EchoRouter(const std::vector<std::pair<std::string, std::string>>& routes) {
  Router router;
  for (const auto& [method, pattern] : routes) {
    router.Add({method, pattern, [pattern = pattern](const Request& req) {
                  return Response::Json(200, {{"route", pattern}, {"params", req.params}});
                }, "help"});
  }
  return router;
}

Json Body(const Response& r) { return Json::parse(r.body); }

TEST(Router, OneSegmentParametersAreDecodedAndMustNotBeEmpty) {
  Router router = EchoRouter({{"GET", "/api/v1/workers/{id}"},
                              {"POST", "/api/v1/workers/{id}/tasks/{task}/report"}});
  Response r = router.Dispatch(Req("GET", "/api/v1/workers/w-a%2Fb"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["params"]["id"], "w-a/b");
  r = router.Dispatch(Req("POST", "/api/v1/workers/w-1/tasks/t-9/report"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["params"]["task"], "t-9");
  // {id} takes exactly one non-empty segment.
  EXPECT_EQ(router.Dispatch(Req("GET", "/api/v1/workers/a/b")).status, 404);
  EXPECT_EQ(router.Dispatch(Req("GET", "/api/v1/workers/")).status, 404);
}

TEST(Router, GreedyParametersTakeTheLongestValueThatLetsTheRestMatch) {
  Router router = EchoRouter({{"POST", "/v1/tensors/{name+}/mapping"},
                              {"PUT", "/v1/tensors/{name+}"},
                              {"GET", "/api/v1/meshes/{m+}/checkpoints/{step}"}});
  Response r = router.Dispatch(Req("POST", "/v1/tensors/dense/kernel/mapping"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["params"]["name"], "dense/kernel");
  r = router.Dispatch(Req("PUT", "/v1/tensors/dense/kernel"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["params"]["name"], "dense/kernel");
  r = router.Dispatch(Req("GET", "/api/v1/meshes/team/a/checkpoints/checkpoints/7"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["params"]["m"], "team/a/checkpoints");
  EXPECT_EQ(Body(r)["params"]["step"], "7");
  // A value never spans an empty segment.
  EXPECT_EQ(router.Dispatch(Req("PUT", "/v1/tensors/a//b")).status, 404);
}

TEST(Router, FirstMatchingRouteWinsInTableOrder) {
  Router router = EchoRouter({{"GET", "/api/v1/meshes/{m+}/checkpoints/latest"},
                              {"GET", "/api/v1/meshes/{m+}/checkpoints/{step}"}});
  Response r = router.Dispatch(Req("GET", "/api/v1/meshes/m/checkpoints/latest"));
  EXPECT_EQ(Body(r)["route"], "/api/v1/meshes/{m+}/checkpoints/latest");
}

TEST(Router, UnknownPathsAndWrongMethodsAreJsonErrorsWithTheirOwnCodes) {
  Router router = EchoRouter({{"GET", "/healthz"}});
  Response r = router.Dispatch(Req("GET", "/nope"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Body(r)["error"]["code"], "not_found");
  EXPECT_EQ(Body(r)["error"]["details"]["field"], "path");
  r = router.Dispatch(Req("DELETE", "/healthz"));
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(Body(r)["error"]["code"], "method_not_allowed");
  bool wrong_method = false;
  Request req = Req("DELETE", "/healthz");
  EXPECT_EQ(router.Match(&req, &wrong_method), nullptr);
  EXPECT_TRUE(wrong_method);
}

TEST(Router, AdaptersTurnResultsIntoResponsesAndErrorsIntoTheirJson) {
  Router router;
  router.Add({"GET", "/json", JsonHandler([](const Request&) -> Result<Json> {
                return Json{{"ok", true}};
              }, 201), ""});
  router.Add({"GET", "/fail", JsonHandler([](const Request&) -> Result<Json> {
                return Conflict("busy", {{"job", "j-1"}});
              }), ""});
  router.Add({"GET", "/raw", Handle([](const Request& req) -> Result<Response> {
                ASSIGN_OR_RETURN(std::string v, RequiredQuery(req, "v"));
                Response r;
                r.body = v;
                r.content_type = "text/plain";
                return r;
              }), ""});
  router.Add({"DELETE", "/x", [](const Request&) { return ReplyStatus(Status::Ok()); }, ""});
  Response r = router.Dispatch(Req("GET", "/json"));
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(Body(r)["ok"], true);
  r = router.Dispatch(Req("GET", "/fail"));
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(Body(r)["error"]["details"]["job"], "j-1");
  Request raw = Req("GET", "/raw");
  raw.query.emplace("v", "hello");
  r = router.Dispatch(raw);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello");
  r = router.Dispatch(Req("GET", "/raw"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Body(r)["error"]["details"]["field"], "v");
  EXPECT_NE(Body(r)["error"]["message"].get<std::string>().find("missing query parameter 'v'"),
            std::string::npos);
  EXPECT_EQ(router.Dispatch(Req("DELETE", "/x")).status, 204);
}

TEST(Router, QueryIntNamesTheParameter) {
  Request req = Req("GET", "/");
  req.query.emplace("wait_ms", "12x");
  auto v = QueryInt(req, "wait_ms", 0);
  EXPECT_EQ(v.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(v.status().details()["field"], "wait_ms");
  EXPECT_EQ(*QueryInt(req, "absent", 7), 7);
}

}  // namespace
}  // namespace tessera::http
