#include "collectives/tensor.h"

namespace tessera::collectives {

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  Tensor t{dtype, std::move(shape), {}};
  t.data.assign(t.num_bytes(), 0);
  return t;
}

Status Tensor::Validate(std::string_view what) const {
  RETURN_IF_ERROR(CheckShapeSize(shape, what));
  if (data.size() != num_bytes()) {
    return InvalidArgument(std::string(what) + " " + DescribeType(dtype, shape) + " needs " +
                               std::to_string(num_bytes()) + " bytes, has " +
                               std::to_string(data.size()),
                           {{"field", what}});
  }
  return Status::Ok();
}

std::string DescribeType(DType dtype, const Shape& shape) {
  return std::string(DTypeName(dtype)) + "[" + ShapeToString(shape) + "]";
}

}  // namespace tessera::collectives
