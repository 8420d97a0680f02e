#include "api/tensor_desc.h"

#include "api/json_codec.h"

namespace tessera {

std::string TensorDesc::ToString() const {
  return std::string(DTypeName(dtype)) + "[" + ShapeToString(shape) + "] layout [" +
         layout.ToString() + "]";
}

Json TensorDescToJson(const TensorDesc& desc) {
  return {{"dtype", DTypeToJson(desc.dtype)},
          {"shape", ShapeToJson(desc.shape)},
          {"layout", LayoutToJson(desc.layout)}};
}

Json TensorMetaToJson(const TensorMeta& meta) {
  Json j = TensorDescToJson(meta);
  j["name"] = meta.name;
  return j;
}

Result<TensorMeta> TensorMetaFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j, "tensor"));
  TensorMeta m;
  ASSIGN_OR_RETURN(m.name, RequiredString(j, "name"));
  ASSIGN_OR_RETURN(m.dtype, DTypeFromJson(j.value("dtype", Json())));
  ASSIGN_OR_RETURN(m.shape, ShapeFromJson(j.value("shape", Json())));
  ASSIGN_OR_RETURN(m.layout, LayoutFromJson(j.value("layout", Json())));
  return m;
}

}  // namespace tessera
