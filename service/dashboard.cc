#include "service/dashboard.h"

#include <map>
#include <memory>

#include "api/names.h"
#include "storage/env.h"

namespace tessera::service {
namespace {

http::Response Serve(const std::string& path, const std::string& content) {
  http::Response r;
  r.body = content;
  r.content_type = ContentTypeFor(path);
  // Always revalidate: a rebuilt tesserad (or an edited --web-dir) is seen on reload.
  r.headers.push_back({"Cache-Control", "no-cache"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  if (path.ends_with(".html")) {
    // The page holds the token: it loads nothing but its own files and talks only to tesserad.
    r.headers.push_back({"Content-Security-Policy",
                         "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
                         "form-action 'none'; frame-ancestors 'none'"});
    r.headers.push_back({"Referrer-Policy", "no-referrer"});
  }
  return r;
}

}  // namespace

std::string ContentTypeFor(std::string_view path) {
  static const std::pair<std::string_view, std::string_view> kTypes[] = {
      {".html", "text/html; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"},
      {".json", "application/json"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".ico", "image/x-icon"},
      {".txt", "text/plain; charset=utf-8"},
  };
  for (const auto& [ext, type] : kTypes) {
    if (path.ends_with(ext)) return std::string(type);
  }
  return "application/octet-stream";
}

void AddDashboardRoutes(http::Router* router, const std::string& web_dir) {
  std::function<Result<std::string>(const std::string&)> read;
  if (web_dir.empty()) {
    auto files = std::make_shared<std::map<std::string, std::string_view, std::less<>>>();
    for (const WebFile& f : EmbeddedWebFiles()) files->emplace(f.path, f.content);
    read = [files](const std::string& path) -> Result<std::string> {
      auto it = files->find(path);
      if (it == files->end()) return NotFound("");
      return std::string(it->second);
    };
  } else {
    read = [web_dir](const std::string& path) -> Result<std::string> {
      storage::Env* env = storage::DefaultEnv();
      const std::string full = storage::JoinPath(web_dir, path);
      if (env->IsDirectory(full)) return NotFound("");
      return storage::ReadWholeFile(env, full);
    };
  }
  auto serve = [read](const std::string& path) {
    // The name rules keep the path below web/ (no "..", "." or empty segments).
    Result<std::string> content =
        ValidateName(path).ok() ? read(path) : Result<std::string>(NotFound(""));
    if (!content.ok()) {
      return http::Response::Error(
          NotFound("no such dashboard file: /" + path, {{"field", "path"}, {"path", "/" + path}}));
    }
    return Serve(path, *content);
  };
  router->Add({"GET", "/", [serve](const http::Request&) { return serve("index.html"); },
               "the dashboard (open; it asks for the token)", /*auth=*/false});
  router->Add({"GET", "/assets/{file+}",
               [serve](const http::Request& req) { return serve("assets/" + req.Param("file")); },
               "the dashboard's scripts and styles", /*auth=*/false});
}

}  // namespace tessera::service
