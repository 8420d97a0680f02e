#include "storage/save_plan.h"

#include <algorithm>
#include <numeric>

namespace tessera::storage {

std::vector<PlannedSlice> PlanSave(const Mesh& mesh, const std::vector<TensorMeta>& tensors) {
  struct Candidate {
    PlannedSlice slice;
    std::vector<int64_t> devices;
  };
  std::vector<Candidate> all;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const auto& meta = tensors[t];
    for (auto& r : DistinctSlices(mesh, meta.layout, meta.shape)) {
      PlannedSlice p;
      p.tensor = t;
      p.bytes = r.slice.NumElements() * DTypeSize(meta.dtype);
      p.slice = std::move(r.slice);
      all.push_back({std::move(p), std::move(r.devices)});
    }
  }
  // Largest first: greedy least-loaded assignment then balances well.
  std::vector<size_t> order(all.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return all[a].slice.bytes > all[b].slice.bytes; });
  std::vector<uint64_t> load(mesh.num_workers(), 0);
  for (size_t i : order) {
    Candidate& c = all[i];
    int64_t best = c.devices[0];
    for (int64_t d : c.devices) {
      if (load[mesh.WorkerOfDevice(d)] < load[mesh.WorkerOfDevice(best)]) best = d;
    }
    c.slice.device = best;
    c.slice.rank = mesh.WorkerOfDevice(best);
    load[c.slice.rank] += c.slice.bytes;
  }
  std::vector<PlannedSlice> out;
  out.reserve(all.size());
  for (auto& c : all) out.push_back(std::move(c.slice));
  return out;
}

std::vector<uint64_t> BytesPerRank(const Mesh& mesh, const std::vector<PlannedSlice>& plan) {
  std::vector<uint64_t> bytes(mesh.num_workers(), 0);
  for (const auto& p : plan) bytes[p.rank] += p.bytes;
  return bytes;
}

}  // namespace tessera::storage
