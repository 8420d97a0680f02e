// What a server decides from a request's header alone: which route, whether the
// request carries its credential, and which thread pool serves it. The gate decides
// once per request, from one parse of the header, and the connection carries the
// decision to the handler thread, which neither parses nor checks again.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "http/router.h"

namespace tessera::http {

struct AdmissionPolicy {
  std::string token;            // empty: no credential is needed
  std::string reserved_prefix;  // empty: no reserved pool
};

struct Admission {
  Request request;               // the header: method, path, params, query, headers; no body
  const Route* route = nullptr;  // null: no route (404, or 405 when method_mismatch)
  bool method_mismatch = false;  // the path matches a route under another method
  bool authorized = false;       // a route, and the request carries what it needs
  bool reserved = false;         // a reserved-prefix path with the token: the reserved pool
};

// Decides on the request header `head` (through its blank line). nullopt when it
// is not an HTTP/1.x request header (ParseRequestHead). `router` outlives the
// admission, which points at its route.
std::optional<Admission> Admit(const Router& router, const AdmissionPolicy& policy,
                               std::string_view head);

}  // namespace tessera::http
