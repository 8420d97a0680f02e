#include "storage/slice_copy.h"

#include <cstring>
#include <vector>

namespace tessera::storage {
namespace {

// Row-major element strides of a box with the given lengths.
std::vector<uint64_t> Strides(const std::vector<int64_t>& lengths) {
  std::vector<uint64_t> s(lengths.size(), 1);
  for (size_t i = lengths.size(); i-- > 1;) s[i - 1] = s[i] * lengths[i];
  return s;
}

}  // namespace

void ForEachRun(const SliceSpec& src, const SliceSpec& dst, size_t elem_size,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& fn) {
  auto inter = Intersect(src, dst);
  if (!inter) return;
  const size_t rank = inter->lengths.size();
  if (rank == 0) {
    fn(0, 0, elem_size);
    return;
  }
  // Merge trailing dims that both boxes hold whole into one contiguous run.
  size_t k = rank - 1;
  uint64_t run = inter->lengths[k];
  while (k > 0 && inter->lengths[k] == src.lengths[k] && inter->lengths[k] == dst.lengths[k]) {
    --k;
    run *= inter->lengths[k];
  }
  const auto ss = Strides(src.lengths), ds = Strides(dst.lengths);
  std::vector<int64_t> idx(k, 0);  // position over the outer dims [0, k)
  while (true) {
    uint64_t so = 0, d_o = 0;
    for (size_t i = 0; i < rank; ++i) {
      int64_t g = inter->offsets[i] + (i < k ? idx[i] : 0);
      so += (g - src.offsets[i]) * ss[i];
      d_o += (g - dst.offsets[i]) * ds[i];
    }
    fn(so * elem_size, d_o * elem_size, run * elem_size);
    size_t d = k;
    while (d > 0) {
      if (++idx[d - 1] < inter->lengths[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

void CopyOverlap(const SliceSpec& src, const void* src_data, const SliceSpec& dst, void* dst_data,
                 size_t elem_size) {
  const char* s = static_cast<const char*>(src_data);
  char* d = static_cast<char*>(dst_data);
  ForEachRun(src, dst, elem_size,
             [&](uint64_t so, uint64_t d_o, uint64_t len) { std::memcpy(d + d_o, s + so, len); });
}

}  // namespace tessera::storage
