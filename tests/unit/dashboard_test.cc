// The dashboard routes without a socket: the embedded copy of web/ matches the
// source tree, "/" and "/assets/..." answer with the right Content-Type and
// without the token, unknown or escaping paths are 404 JSON, and a web
// directory given at start is served from disk.
#include "service/dashboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <set>

#include "storage/env.h"

namespace tessera::service {
namespace {

http::Response Get(const http::Router& router, const std::string& path) {
  http::Request req;
  req.method = "GET";
  req.path = path;
  return router.Dispatch(req);
}

http::Router EmbeddedRouter() {
  http::Router router;
  AddDashboardRoutes(&router);
  return router;
}

void ExpectNotFound(const http::Response& r, const std::string& path) {
  EXPECT_EQ(r.status, 404) << path;
  EXPECT_EQ(r.content_type, "application/json") << path;
  Json body = Json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << r.body;
  EXPECT_EQ(body["error"]["code"], "not_found") << r.body;
  EXPECT_EQ(body["error"]["details"]["field"], "path") << r.body;
}

std::string Header(const http::Response& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

TEST(Dashboard, EmbeddedFilesAreExactlyTheSourceTree) {
  storage::Env* env = storage::DefaultEnv();
  const std::string web = std::string(TESSERA_SOURCE_DIR) + "/web";
  std::set<std::string> on_disk;
  std::vector<std::string> dirs = {""};
  while (!dirs.empty()) {
    std::string rel = dirs.back();
    dirs.pop_back();
    auto names = env->ListDir(storage::JoinPath(web, rel));
    ASSERT_TRUE(names.ok()) << names.status().ToString();
    for (const auto& name : *names) {
      std::string child = rel.empty() ? name : rel + "/" + name;
      if (env->IsDirectory(storage::JoinPath(web, child))) {
        dirs.push_back(child);
      } else {
        on_disk.insert(child);
      }
    }
  }
  std::set<std::string> embedded;
  for (const WebFile& f : EmbeddedWebFiles()) {
    embedded.insert(std::string(f.path));
    auto content = storage::ReadWholeFile(env, storage::JoinPath(web, std::string(f.path)));
    ASSERT_TRUE(content.ok()) << f.path;
    EXPECT_EQ(*content, f.content) << f.path << " changed since the build embedded it";
  }
  EXPECT_EQ(embedded, on_disk);
  EXPECT_TRUE(embedded.count("index.html"));
}

TEST(Dashboard, ServesTheHtmlAtTheRootAndAssetsWithTheirTypes) {
  http::Router router = EmbeddedRouter();
  http::Response index = Get(router, "/");
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.content_type, "text/html; charset=utf-8");
  EXPECT_NE(index.body.find("<script type=\"module\" src=\"assets/js/main.js\">"),
            std::string::npos)
      << index.body;
  // The page holds the token: it may load only its own files.
  EXPECT_NE(Header(index, "Content-Security-Policy").find("default-src 'self'"), std::string::npos);

  http::Response js = Get(router, "/assets/js/main.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.content_type, "text/javascript; charset=utf-8");
  EXPECT_NE(js.body.find("import"), std::string::npos);
  EXPECT_EQ(Header(js, "X-Content-Type-Options"), "nosniff");

  http::Response css = Get(router, "/assets/app.css");
  EXPECT_EQ(css.status, 200);
  EXPECT_EQ(css.content_type, "text/css; charset=utf-8");

  // Every module the page imports resolves (imports are relative: ./x.js, ../x.js).
  for (const WebFile& f : EmbeddedWebFiles()) {
    if (!f.path.ends_with(".js")) continue;
    EXPECT_EQ(Get(router, "/" + std::string(f.path)).status, 200) << f.path;
  }
}

TEST(Dashboard, IsOpenWithoutTheToken) {
  http::Router router = EmbeddedRouter();
  ASSERT_EQ(router.routes().size(), 2u);
  for (const auto& route : router.routes()) EXPECT_FALSE(route.auth) << route.pattern;
}

TEST(Dashboard, UnknownOrEscapingPathsAreNotFound) {
  http::Router router = EmbeddedRouter();
  for (const std::string path :
       {"/assets/nope.js", "/assets/js", "/assets/../index.html", "/assets/%2e%2e/index.html",
        "/assets/js/../app.css", "/assets/js/main.js%00", "/assets/.//app.css"}) {
    ExpectNotFound(Get(router, path), path);
  }
  http::Response r = Get(router, "/assets/nope.js");
  EXPECT_NE(r.body.find("/assets/nope.js"), std::string::npos) << r.body;
}

TEST(Dashboard, ContentTypes) {
  EXPECT_EQ(ContentTypeFor("a/b.svg"), "image/svg+xml");
  EXPECT_EQ(ContentTypeFor("x.json"), "application/json");
  EXPECT_EQ(ContentTypeFor("x.mjs"), "text/javascript; charset=utf-8");
  EXPECT_EQ(ContentTypeFor("Makefile"), "application/octet-stream");
}

TEST(Dashboard, AWebDirIsServedFromDisk) {
  char tmpl[] = "/tmp/tessera_dashboard_test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  storage::Env* env = storage::DefaultEnv();
  ASSERT_TRUE(env->CreateDirs(dir + "/assets/js").ok());
  ASSERT_TRUE(storage::WriteFileDurably(env, dir + "/index.html", "<h1>dev</h1>").ok());
  ASSERT_TRUE(storage::WriteFileDurably(env, dir + "/assets/js/x.js", "export {};").ok());

  http::Router router;
  AddDashboardRoutes(&router, dir);
  http::Response index = Get(router, "/");
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.body, "<h1>dev</h1>");
  // Edits show without a restart.
  ASSERT_TRUE(storage::WriteFileDurably(env, dir + "/index.html", "<h1>edited</h1>").ok());
  EXPECT_EQ(Get(router, "/").body, "<h1>edited</h1>");
  http::Response js = Get(router, "/assets/js/x.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(js.body, "export {};");
  ExpectNotFound(Get(router, "/assets/js"), "a directory");
  ExpectNotFound(Get(router, "/assets/main.js"), "a file that only the embedded copy has");
  ExpectNotFound(Get(router, "/assets/../index.html"), "an escape");
  EXPECT_TRUE(env->DeleteTree(dir).ok());
}

}  // namespace
}  // namespace tessera::service
