// Name rules of docs/openapi.json for meshes, tensors, barriers and KV keys: 1–200 chars
// of [A-Za-z0-9._/-], no ".." segment, no leading "/". Names become path parts,
// so anything else is rejected before it reaches the file system.
#pragma once

#include <cstdint>
#include <string_view>

#include "api/status.h"

namespace tessera {

inline constexpr size_t kMaxNameLength = 200;

// ok, or invalid_argument naming `field` and saying which rule broke.
Status ValidateName(std::string_view name, std::string_view field = "name");

// A checkpoint step as a path or query gives it: a non-negative decimal integer, else
// invalid_argument naming `field`.
Result<int64_t> ParseStep(std::string_view text, std::string_view field = "step");

}  // namespace tessera
