// Base64 (RFC 4648, standard alphabet, padded) for putting arbitrary bytes
// inside JSON documents, which must be valid UTF-8.
#pragma once

#include <string>
#include <string_view>

#include "api/status.h"

namespace tessera {

std::string Base64Encode(std::string_view bytes);
// invalid_argument naming `what` for a wrong length or a character outside the alphabet.
Result<std::string> Base64Decode(std::string_view text, std::string_view what = "base64");

}  // namespace tessera
