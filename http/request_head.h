// A request's header, parsed from the raw bytes the gate holds (gate.h), for the
// decisions a server makes before a handler thread is spent on a request: which
// route, and whether it carries the credential.
#pragma once

#include <optional>
#include <string_view>

#include "http/router.h"

namespace tessera::http {

// Method, path, query (percent-decoded) and headers (lower-case names) of the
// request header `head` (through its blank line); no body. nullopt when it is
// not an HTTP/1.x request header: the handler's parser then answers it.
std::optional<Request> ParseRequestHead(std::string_view head);

}  // namespace tessera::http
