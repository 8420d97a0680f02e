// Shapes and slices: a slice is a box (offsets[], lengths[]) in a global shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/status.h"

namespace tessera {

using Shape = std::vector<int64_t>;

// Product of dims (1 for a scalar).
int64_t NumElements(const Shape& shape);
// "8,4" (empty string for a scalar).
std::string ShapeToString(const Shape& shape);
inline constexpr size_t kMaxRank = 32;
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

// Rank ≤ kMaxRank, 0 ≤ dims ≤ kMaxElements, product ≤ kMaxElements (no overflow
// anywhere after, offset + length of a slice included).
Status CheckShapeSize(const Shape& shape, std::string_view field = "shape");
// Parses "8,4"; dims must be non-negative integers. Errors name `field`.
Result<Shape> ParseShape(std::string_view text, std::string_view field = "shape");

struct SliceSpec {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;

  int64_t NumElements() const;
  bool operator==(const SliceSpec&) const = default;
  // "[0:4, 2:4]" for messages.
  std::string ToString() const;
};

// The whole of `shape` as one slice.
SliceSpec FullSlice(const Shape& shape);
// The overlap of two slices of the same rank, or nullopt if empty.
std::optional<SliceSpec> Intersect(const SliceSpec& a, const SliceSpec& b);
// True if `inner` lies within `outer`.
bool Contains(const SliceSpec& outer, const SliceSpec& inner);

}  // namespace tessera
