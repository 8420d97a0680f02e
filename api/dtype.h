// Element types of docs/openapi.json, with their sizes and wire names.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "api/status.h"

namespace tessera {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt8, kInt16, kInt32, kInt64, kUInt8, kBool };

// Bytes per element.
size_t DTypeSize(DType dtype);
// "float32", "bfloat16", ... as used in JSON and query strings.
std::string_view DTypeName(DType dtype);
// Parses a DTypeName; anything else is invalid_argument naming `field`.
Result<DType> ParseDType(std::string_view name, std::string_view field = "dtype");
// Every dtype, in declaration order.
const std::vector<DType>& AllDTypes();

}  // namespace tessera
