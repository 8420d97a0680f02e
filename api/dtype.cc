#include "api/dtype.h"

#include <string>

namespace tessera {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4}, {DType::kFloat64, "float64", 8},
    {DType::kFloat16, "float16", 2}, {DType::kBFloat16, "bfloat16", 2},
    {DType::kInt8, "int8", 1},       {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},     {DType::kInt64, "int64", 8},
    {DType::kUInt8, "uint8", 1},     {DType::kBool, "bool", 1},
};

}  // namespace

size_t DTypeSize(DType dtype) { return kDTypes[static_cast<int>(dtype)].size; }

std::string_view DTypeName(DType dtype) { return kDTypes[static_cast<int>(dtype)].name; }

Result<DType> ParseDType(std::string_view name, std::string_view field) {
  for (const auto& d : kDTypes) {
    if (d.name == name) return d.dtype;
  }
  std::string known;
  for (const auto& d : kDTypes) known += (known.empty() ? "" : " ") + std::string(d.name);
  return InvalidArgument("unknown dtype '" + std::string(name) + "' (expected one of: " + known + ")",
                         {{"field", field}});
}

const std::vector<DType>& AllDTypes() {
  static const std::vector<DType> all = [] {
    std::vector<DType> v;
    for (const auto& d : kDTypes) v.push_back(d.dtype);
    return v;
  }();
  return all;
}

}  // namespace tessera
