#include "api/shape.h"

#include <algorithm>
#include <charconv>

namespace tessera {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s;
}

Result<Shape> ParseShape(std::string_view text, std::string_view field) {
  Shape shape;
  if (text.empty()) return shape;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view part = text.substr(pos, comma == std::string_view::npos ? text.npos : comma - pos);
    int64_t v = -1;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || ptr != part.data() + part.size() || v < 0 || part.empty()) {
      return InvalidArgument("malformed shape '" + std::string(text) +
                                 "': expected comma-separated non-negative integers such as 8,4",
                             {{"field", field}});
    }
    shape.push_back(v);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  RETURN_IF_ERROR(CheckShapeSize(shape, field));
  return shape;
}

Status CheckShapeSize(const Shape& shape, std::string_view field) {
  if (shape.size() > kMaxRank) {
    return InvalidArgument("shape has more than " + std::to_string(kMaxRank) + " dimensions",
                           {{"field", field}});
  }
  // The product of the non-zero dimensions: a zero elsewhere leaves no element, but
  // every part of the shape (a row's elements, a slice's end) must stay in range too.
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxElements || __builtin_mul_overflow(n, d == 0 ? 1 : d, &n) ||
        n > kMaxElements) {
      return InvalidArgument("shape [" + ShapeToString(shape) + "] is too large (at most 2^48 elements)",
                             {{"field", field}});
    }
  }
  return Status::Ok();
}

int64_t SliceSpec::NumElements() const { return tessera::NumElements(lengths); }

std::string SliceSpec::ToString() const {
  std::string s = "[";
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(offsets[i]) + ":" + std::to_string(offsets[i] + lengths[i]);
  }
  return s + "]";
}

SliceSpec FullSlice(const Shape& shape) {
  return SliceSpec{std::vector<int64_t>(shape.size(), 0), shape};
}

std::optional<SliceSpec> Intersect(const SliceSpec& a, const SliceSpec& b) {
  if (a.offsets.size() != b.offsets.size()) return std::nullopt;
  SliceSpec out;
  for (size_t i = 0; i < a.offsets.size(); ++i) {
    int64_t lo = std::max(a.offsets[i], b.offsets[i]);
    int64_t hi = std::min(a.offsets[i] + a.lengths[i], b.offsets[i] + b.lengths[i]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.lengths.push_back(hi - lo);
  }
  return out;
}

bool Contains(const SliceSpec& outer, const SliceSpec& inner) {
  if (outer.offsets.size() != inner.offsets.size()) return false;
  for (size_t i = 0; i < outer.offsets.size(); ++i) {
    if (inner.offsets[i] < outer.offsets[i] ||
        inner.offsets[i] + inner.lengths[i] > outer.offsets[i] + outer.lengths[i]) {
      return false;
    }
  }
  return true;
}

}  // namespace tessera
