// Dense tensors as the collectives see them: a dtype, a shape and row-major bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/dtype.h"
#include "api/shape.h"
#include "api/status.h"

namespace tessera::collectives {

struct Tensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  // NumElements(shape) · DTypeSize(dtype) bytes, row-major, host byte order.
  // float16/bfloat16 elements are their 16-bit patterns; bool is one byte, 0 or 1.
  std::vector<uint8_t> data;

  // A zero-filled tensor. REQUIRES: a valid shape (CheckShapeSize).
  static Tensor Zeros(DType dtype, Shape shape);

  int64_t num_elements() const { return NumElements(shape); }
  // The byte count `data` must have.
  size_t num_bytes() const { return static_cast<size_t>(num_elements()) * DTypeSize(dtype); }
  // invalid_argument unless the shape is valid and `data` holds exactly num_bytes();
  // the message names `what` ("input", "tensors[3]", ...).
  Status Validate(std::string_view what = "tensor") const;

  // Typed views of `data`. REQUIRES: sizeof(T) == DTypeSize(dtype).
  template <typename T>
  std::span<T> values() {
    return {reinterpret_cast<T*>(data.data()), data.size() / sizeof(T)};
  }
  template <typename T>
  std::span<const T> values() const {
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }

  bool operator==(const Tensor&) const = default;
};

// "float32[8,4]" (a scalar is "float32[]"): how messages name a tensor's type.
std::string DescribeType(DType dtype, const Shape& shape);

}  // namespace tessera::collectives
