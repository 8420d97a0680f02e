// The browser dashboard (web/): static files that tesserad serves at "/" and
// "/assets/...", open without the token (docs/openapi.json: the page asks for it). The
// files are built into the binary (cmake/embed_web.cmake), so tesserad serves
// them wherever it runs from; a web directory given instead is read from disk
// on every request, for editing the dashboard without a rebuild.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "http/router.h"

namespace tessera::service {

struct WebFile {
  std::string_view path;  // relative to web/: "index.html", "assets/app.css"
  std::string_view content;
};

// The files of web/ as they were at build time, sorted by path. Defined in the
// generated web_files.cc.
const std::vector<WebFile>& EmbeddedWebFiles();

// Content-Type by file extension (text types in UTF-8); application/octet-stream
// for an unknown one.
std::string ContentTypeFor(std::string_view path);

// Adds GET / (index.html) and GET /assets/{file+} (web/assets/<file>), both
// without auth. `web_dir` empty: the embedded files; else the files under it.
// An unknown file is docs/openapi.json's 404 not_found naming the path.
void AddDashboardRoutes(http::Router* router, const std::string& web_dir = "");

}  // namespace tessera::service
