// Name rules of API.md for meshes, tensors, barriers and KV keys: 1–200 chars
// of [A-Za-z0-9._/-], no ".." segment, no leading "/". Names become path parts,
// so anything else is rejected before it reaches the file system.
#pragma once

#include <string_view>

#include "api/status.h"

namespace tessera {

inline constexpr size_t kMaxNameLength = 200;

// ok, or invalid_argument naming `field` and saying which rule broke.
Status ValidateName(std::string_view name, std::string_view field = "name");

}  // namespace tessera
