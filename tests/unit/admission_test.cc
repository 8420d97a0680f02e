// The one decision a server makes from a request's header (admission.h): its route,
// whether it carries the credential the route needs, and whether it may take a
// reserved thread. Pure: a header in, a decision out, no socket.
#include "http/admission.h"

#include <gtest/gtest.h>

namespace tessera::http {
namespace {

Router Routes() {
  Router router;
  auto ok = [](const Request&) { return Response::Json(200, {{"ok", true}}); };
  router.Add({"GET", "/healthz", ok, "", false});
  router.Add({"GET", "/api/v1/workers/{id}", ok, ""});
  router.Add({"POST", "/api/v1/workers/{id}/heartbeat", ok, ""});
  router.Add({"GET", "/api/v1/events", ok, "", true, nullptr, true});
  return router;
}

const AdmissionPolicy kPolicy{"secret", "/api/v1/workers/"};

std::string Head(const std::string& line, const std::string& headers = "") {
  return line + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n";
}

TEST(Admission, ARouteWithItsTokenIsAuthorizedAndItsParamsAreFilled) {
  const Router router = Routes();
  auto a = Admit(router, kPolicy,
                 Head("GET /api/v1/workers/w-a%2Fb?x=1", "Authorization: Bearer secret\r\n"));
  ASSERT_TRUE(a.has_value());
  ASSERT_NE(a->route, nullptr);
  EXPECT_EQ(a->route->pattern, "/api/v1/workers/{id}");
  EXPECT_EQ(a->request.Param("id"), "w-a/b");
  EXPECT_EQ(a->request.Query("x"), "1");
  EXPECT_TRUE(a->authorized);
  EXPECT_TRUE(a->reserved);
}

TEST(Admission, AWrongOrMissingTokenIsNeitherAuthorizedNorReserved) {
  const Router router = Routes();
  for (const std::string& auth : {std::string(), std::string("Authorization: Bearer nope\r\n")}) {
    auto a = Admit(router, kPolicy, Head("POST /api/v1/workers/w-1/heartbeat", auth));
    ASSERT_TRUE(a.has_value());
    ASSERT_NE(a->route, nullptr);
    EXPECT_FALSE(a->authorized) << auth;
    EXPECT_FALSE(a->reserved) << auth;
  }
}

TEST(Admission, OpenRoutesNeedNoToken) {
  const Router router = Routes();
  auto a = Admit(router, kPolicy, Head("GET /healthz"));
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->authorized);
  EXPECT_FALSE(a->reserved);
  // Without a token every route is open, and the reserved prefix alone reserves.
  auto open = Admit(router, {"", "/api/v1/workers/"}, Head("GET /api/v1/workers/w-1"));
  ASSERT_TRUE(open.has_value());
  EXPECT_TRUE(open->authorized);
  EXPECT_TRUE(open->reserved);
}

TEST(Admission, OnlyAQueryTokenRouteTakesTheTokenFromTheQuery) {
  const Router router = Routes();
  auto events = Admit(router, kPolicy, Head("GET /api/v1/events?token=secret"));
  ASSERT_TRUE(events.has_value());
  EXPECT_TRUE(events->authorized);
  auto worker = Admit(router, kPolicy, Head("GET /api/v1/workers/w-1?token=secret"));
  ASSERT_TRUE(worker.has_value());
  EXPECT_FALSE(worker->authorized);
  EXPECT_FALSE(worker->reserved);  // a token in the URL never reserves a thread
}

TEST(Admission, NoRouteIsNeverAuthorizedAndNamesAMethodMismatch) {
  const Router router = Routes();
  auto missing = Admit(router, kPolicy, Head("GET /nowhere", "Authorization: Bearer secret\r\n"));
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->route, nullptr);
  EXPECT_FALSE(missing->authorized);
  EXPECT_FALSE(missing->method_mismatch);
  auto wrong = Admit(router, kPolicy, Head("DELETE /healthz"));
  ASSERT_TRUE(wrong.has_value());
  EXPECT_EQ(wrong->route, nullptr);
  EXPECT_TRUE(wrong->method_mismatch);
}

TEST(Admission, AHeaderThatIsNotHttp1IsNotAdmitted) {
  const Router router = Routes();
  EXPECT_FALSE(Admit(router, kPolicy, "GET /healthz HTTP/2\r\n\r\n").has_value());
  EXPECT_FALSE(Admit(router, kPolicy, "GET http://x/healthz HTTP/1.1\r\n\r\n").has_value());
  EXPECT_FALSE(Admit(router, kPolicy, "garbage\r\n\r\n").has_value());
}

TEST(Admission, AFragmentIsNotPartOfThePath) {
  const Router router = Routes();
  auto a = Admit(router, kPolicy, Head("GET /healthz#top"));
  ASSERT_TRUE(a.has_value());
  EXPECT_NE(a->route, nullptr);
}

}  // namespace
}  // namespace tessera::http
