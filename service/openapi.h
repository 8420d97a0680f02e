// The REST reference, docs/openapi.json (OpenAPI 3), as embedded at build time: tesserad
// serves it at GET /api/v1/openapi.json, and a test holds it to the route table.
#pragma once

#include <string_view>

namespace tessera::service {

std::string_view OpenApiDocument();

}  // namespace tessera::service
