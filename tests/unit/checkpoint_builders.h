// Synthetic tensors with their global bytes and per-device shards, and a
// SaveRequest over them: the inputs of the storage tests and of the fuzz
// targets' seed corpora (no GoogleTest here, so fuzz/ can use it too).
#pragma once

#include <string>
#include <vector>

#include "api/mesh.h"
#include "storage/local_checkpoint.h"
#include "storage/testing/mem_env.h"
#include "storage/slice_copy.h"
#include "storage/synthetic.h"

namespace tessera::testing {

struct SyntheticTensor {
  storage::TensorMeta meta;
  std::string global;
  std::vector<std::string> shards;  // by device
};

inline SyntheticTensor MakeTensor(const Mesh& mesh, storage::TensorMeta meta, uint64_t seed) {
  SyntheticTensor t{std::move(meta), {}, {}};
  t.global = storage::SyntheticBytes(t.meta.dtype, NumElements(t.meta.shape), seed);
  const size_t esize = DTypeSize(t.meta.dtype);
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    SliceSpec s = DeviceSlice(mesh, t.meta.layout, t.meta.shape, d);
    std::string local(s.NumElements() * esize, '\0');
    storage::CopyOverlap(FullSlice(t.meta.shape), t.global.data(), s, local.data(), esize);
    t.shards.push_back(std::move(local));
  }
  return t;
}

// The bytes of `slice` of a tensor, cut from its global bytes.
inline std::string Expected(const SyntheticTensor& t, const SliceSpec& slice) {
  const size_t esize = DTypeSize(t.meta.dtype);
  std::string out(slice.NumElements() * esize, '\0');
  storage::CopyOverlap(FullSlice(t.meta.shape), t.global.data(), slice, out.data(), esize);
  return out;
}

inline Mesh Mesh22(const std::string& name = "m") {
  return Mesh{name, {{"data", 2}, {"model", 2}}, 1};
}

// A small mixed set: sharded, partly sharded, replicated, scalar; several dtypes.
inline std::vector<SyntheticTensor> MixedTensors(const Mesh& mesh, uint64_t seed = 1) {
  auto L = [](std::vector<std::string> d) { return Layout{std::move(d)}; };
  std::vector<storage::TensorMeta> metas = {
      {"w", DType::kFloat32, {64, 32}, L({"data", "model"})},
      {"emb", DType::kBFloat16, {128, 16}, L({"unsharded", "model"})},
      {"bias", DType::kFloat16, {32}, L({"unsharded"})},
      {"step", DType::kInt64, {}, L({})},
      {"mask", DType::kBool, {8, 8}, L({"model", "data"})},
      {"ids", DType::kInt32, {16, 4}, L({"data", "unsharded"})},
  };
  std::vector<SyntheticTensor> out;
  for (size_t i = 0; i < metas.size(); ++i) out.push_back(MakeTensor(mesh, metas[i], seed * 100 + i));
  return out;
}

inline storage::SaveRequest MakeRequest(const std::string& root, const Mesh& mesh, int64_t step,
                                        const std::vector<SyntheticTensor>& tensors,
                                        storage::ShardOptions options = {}) {
  storage::SaveRequest req;
  req.root = root;
  req.mesh = mesh;
  req.step = step;
  for (const auto& t : tensors) req.tensors.push_back(t.meta);
  req.source = [&tensors](size_t t, int64_t d) -> const void* { return tensors[t].shards[d].data(); };
  req.options = options;
  return req;
}

}  // namespace tessera::testing
