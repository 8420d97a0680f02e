// A request's header, parsed once from the raw bytes the gate holds (gate.h), for the
// decisions a server makes before a handler thread is spent on a request (admission.h)
// and for the handler itself.
#pragma once

#include <optional>
#include <string_view>

#include "http/router.h"

namespace tessera::http {

// Method, path, query (percent-decoded) and headers (lower-case names) of the
// request header `head` (through its blank line); no body. The path is the raw
// target up to '?' (a fragment dropped). nullopt when it is not an HTTP/1.x request
// header: httplib's parser then answers it (400).
std::optional<Request> ParseRequestHead(std::string_view head);

}  // namespace tessera::http
