#include "collectives/tree_gather.h"

#include <algorithm>
#include <cstring>

namespace tessera::collectives {
namespace {

// The ranks [rank, end) of rank's subtree.
int SubtreeEnd(int rank, int size) {
  if (rank == 0) return size;
  return std::min(size, rank + (rank & -rank));
}

}  // namespace

std::vector<int> TreeNeighbours(int rank, int size) {
  std::vector<int> out;
  if (rank < 0 || rank >= size) return out;
  if (rank > 0) out.push_back(rank & (rank - 1));
  for (int step = 1; step < size && (rank == 0 || step < (rank & -rank)); step <<= 1) {
    if (rank + step < size) out.push_back(rank + step);
  }
  return out;
}

Result<std::vector<uint8_t>> TreeAllGather(Transport& t, std::span<const uint8_t> record,
                                           Deadline deadline) {
  const int n = t.size();
  const int me = t.rank();
  const size_t len = record.size();
  std::vector<uint8_t> all(static_cast<size_t>(n) * len);
  if (len > 0) std::memcpy(all.data() + static_cast<size_t>(me) * len, record.data(), len);
  const std::vector<int> near = TreeNeighbours(me, n);
  RETURN_IF_ERROR(t.Reach(near, deadline));
  const bool has_parent = me > 0;
  // Up: each child's subtree lands in its place; then this subtree goes to the parent.
  for (size_t i = has_parent ? 1 : 0; i < near.size(); ++i) {
    const int child = near[i];
    const size_t bytes = static_cast<size_t>(SubtreeEnd(child, n) - child) * len;
    RETURN_IF_ERROR(t.RecvInto(child, std::span<uint8_t>(all.data() + child * len, bytes), deadline));
  }
  if (has_parent) {
    const size_t bytes = static_cast<size_t>(SubtreeEnd(me, n) - me) * len;
    RETURN_IF_ERROR(t.Send(near[0], ConstBytes(all.data() + static_cast<size_t>(me) * len, bytes), deadline));
    // Down: the whole set from the parent.
    RETURN_IF_ERROR(t.RecvInto(near[0], std::span<uint8_t>(all.data(), all.size()), deadline));
  }
  for (size_t i = has_parent ? 1 : 0; i < near.size(); ++i) {
    RETURN_IF_ERROR(t.Send(near[i], ConstBytes(all.data(), all.size()), deadline));
  }
  return all;
}

Result<std::vector<int64_t>> TreeAllGather(Transport& t, std::span<const int64_t> record,
                                           Deadline deadline) {
  const std::span<const uint8_t> raw(reinterpret_cast<const uint8_t*>(record.data()),
                                     record.size() * sizeof(int64_t));
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, TreeAllGather(t, raw, deadline));
  std::vector<int64_t> out(bytes.size() / sizeof(int64_t));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace tessera::collectives
