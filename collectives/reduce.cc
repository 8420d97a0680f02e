#include "collectives/reduce.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "collectives/buffer.h"
#include "api/half.h"

namespace tessera::collectives {
namespace {

// Calls f(T{}) with the C++ type of accumulation dtype `dtype` (bool as uint8_t).
template <typename F>
void DispatchAccum(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      return f(float{});
    case DType::kFloat64:
      return f(double{});
    case DType::kInt8:
      return f(int8_t{});
    case DType::kInt16:
      return f(int16_t{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kUInt8:
    case DType::kBool:
      return f(uint8_t{});
  }
}

// Integer arithmetic in an unsigned type at least as wide as int, so that
// overflow wraps instead of being undefined (int8·int8 would promote to int).
template <typename T>
using Wide = std::conditional_t<sizeof(T) <= 4, uint32_t, uint64_t>;

template <typename T, typename F>
void Apply(const uint8_t* a, const uint8_t* b, uint8_t* out, size_t count, F f) {
  const T* pa = reinterpret_cast<const T*>(a);
  const T* pb = reinterpret_cast<const T*>(b);
  T* po = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) po[i] = f(pa[i], pb[i]);
}

template <typename T>
void ReduceTyped(ReduceOp op, const uint8_t* a, const uint8_t* b, uint8_t* out, size_t count) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        return Apply<T>(a, b, out, count, [](T x, T y) { return x + y; });
      case ReduceOp::kProd:
        return Apply<T>(a, b, out, count, [](T x, T y) { return x * y; });
      case ReduceOp::kMin:
        return Apply<T>(a, b, out, count, [](T x, T y) {
          return std::isnan(x) ? x : std::isnan(y) ? y : (y < x ? y : x);
        });
      case ReduceOp::kMax:
        return Apply<T>(a, b, out, count, [](T x, T y) {
          return std::isnan(x) ? x : std::isnan(y) ? y : (y > x ? y : x);
        });
    }
  } else {
    using W = Wide<T>;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        return Apply<T>(a, b, out, count, [](T x, T y) {
          return static_cast<T>(static_cast<W>(x) + static_cast<W>(y));
        });
      case ReduceOp::kProd:
        return Apply<T>(a, b, out, count, [](T x, T y) {
          return static_cast<T>(static_cast<W>(x) * static_cast<W>(y));
        });
      case ReduceOp::kMin:
        return Apply<T>(a, b, out, count, [](T x, T y) { return y < x ? y : x; });
      case ReduceOp::kMax:
        return Apply<T>(a, b, out, count, [](T x, T y) { return y > x ? y : x; });
    }
  }
}

void ReduceBool(ReduceOp op, const uint8_t* a, const uint8_t* b, uint8_t* out, size_t count) {
  if (op == ReduceOp::kProd || op == ReduceOp::kMin) {
    for (size_t i = 0; i < count; ++i) out[i] = (a[i] != 0) & (b[i] != 0);
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = (a[i] != 0) | (b[i] != 0);
  }
}

template <typename T>
void Convert(const uint8_t* in, size_t count, uint8_t* out, T (*f)(float)) {
  const float* src = reinterpret_cast<const float*>(in);
  T* dst = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) dst[i] = f(src[i]);
}

}  // namespace

DType AccumDType(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 ? DType::kFloat32 : dtype;
}

Status CheckReducible(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool && op == ReduceOp::kMean) {
    return InvalidArgument("mean is not defined for bool (use sum for any, prod for all)",
                           {{"field", "reduce"}});
  }
  return Status::Ok();
}

void ReduceElements(ReduceOp op, DType dtype, const uint8_t* a, const uint8_t* b, uint8_t* out,
                    size_t count) {
  if (dtype == DType::kBool) return ReduceBool(op, a, b, out, count);
  DispatchAccum(dtype, [&](auto tag) { ReduceTyped<decltype(tag)>(op, a, b, out, count); });
}

void DivideElements(DType dtype, uint8_t* data, size_t count, int64_t divisor) {
  if (divisor == 1 || dtype == DType::kBool) return;
  DispatchAccum(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(data);
    for (size_t i = 0; i < count; ++i) {
      if constexpr (std::is_floating_point_v<T>) {
        p[i] = p[i] / static_cast<T>(divisor);
      } else {
        p[i] = static_cast<T>(static_cast<int64_t>(p[i]) / divisor);
      }
    }
  });
}

void ToAccum(DType dtype, const uint8_t* in, size_t count, uint8_t* out) {
  const uint16_t* src = reinterpret_cast<const uint16_t*>(in);
  float* dst = reinterpret_cast<float*>(out);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(src[i]);
  } else if (dtype == DType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) dst[i] = BFloat16ToFloat(src[i]);
  } else {
    CopyBytes(out, in, count * DTypeSize(dtype));
  }
}

void FromAccum(DType dtype, const uint8_t* in, size_t count, uint8_t* out) {
  if (dtype == DType::kFloat16) {
    Convert<uint16_t>(in, count, out, FloatToHalf);
  } else if (dtype == DType::kBFloat16) {
    Convert<uint16_t>(in, count, out, FloatToBFloat16);
  } else {
    CopyBytes(out, in, count * DTypeSize(dtype));
  }
}

NonFinite CountNonFinite(DType dtype, const uint8_t* data, size_t count) {
  NonFinite found;
  auto note = [&](size_t i, bool nan, bool inf) {
    if (!nan && !inf) return;
    (nan ? found.nan : found.inf)++;
    if (found.first_index < 0) found.first_index = static_cast<int64_t>(i);
  };
  const uint16_t* half = reinterpret_cast<const uint16_t*>(data);
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
      DispatchAccum(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* p = reinterpret_cast<const T*>(data);
        for (size_t i = 0; i < count; ++i) note(i, std::isnan(p[i]), std::isinf(p[i]));
      });
      break;
    case DType::kFloat16:  // exponent all ones: infinity if the mantissa is 0, else NaN
      for (size_t i = 0; i < count; ++i) {
        bool special = (half[i] & 0x7c00u) == 0x7c00u;
        note(i, special && (half[i] & 0x3ffu), special && !(half[i] & 0x3ffu));
      }
      break;
    case DType::kBFloat16:
      for (size_t i = 0; i < count; ++i) {
        bool special = (half[i] & 0x7f80u) == 0x7f80u;
        note(i, special && (half[i] & 0x7fu), special && !(half[i] & 0x7fu));
      }
      break;
    default:
      break;
  }
  return found;
}

}  // namespace tessera::collectives
