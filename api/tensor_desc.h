// What a tensor is, globally (dtype, global shape, layout over a mesh), and the same
// with its name, as a checkpoint and a save task list it. Every shard of a tensor on
// every worker agrees on its TensorDesc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "api/dtype.h"
#include "api/mesh.h"
#include "api/shape.h"
#include "api/status.h"

namespace tessera {

struct TensorDesc {
  DType dtype = DType::kFloat32;
  Shape shape;  // global
  Layout layout;

  bool operator==(const TensorDesc&) const = default;
  // "float32[8,4] layout [data,unsharded]" for messages.
  std::string ToString() const;
  uint64_t logical_bytes() const { return NumElements(shape) * DTypeSize(dtype); }
};

struct TensorMeta : TensorDesc {
  std::string name;

  TensorMeta() = default;
  TensorMeta(std::string n, TensorDesc desc) : TensorDesc(std::move(desc)), name(std::move(n)) {}
  TensorMeta(std::string n, DType dtype, Shape shape, Layout layout)
      : TensorDesc{dtype, std::move(shape), std::move(layout)}, name(std::move(n)) {}
  bool operator==(const TensorMeta&) const = default;
  const TensorDesc& desc() const { return *this; }
};

// {"dtype","shape","layout"}.
nlohmann::json TensorDescToJson(const TensorDesc& desc);
// {"name","dtype","shape","layout"}.
nlohmann::json TensorMetaToJson(const TensorMeta& meta);
// Decodes {"name","dtype","shape","layout"} from untrusted input; errors name the field.
Result<TensorMeta> TensorMetaFromJson(const nlohmann::json& j);

}  // namespace tessera
