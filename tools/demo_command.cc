// `tessera demo`: a real checkpoint of synthetic tensors (several dtypes, a
// replicated and sharded tensors over a 2×2 mesh), inspected, verified and
// read back — on the saved mesh and resharded onto another.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "api/mesh.h"
#include "storage/checkpoint_dir.h"
#include "storage/local_checkpoint.h"
#include "storage/slice_copy.h"
#include "storage/synthetic.h"
#include "storage/thread_pool.h"
#include "tools/commands.h"

namespace tessera::tools {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct DemoTensor {
  storage::TensorMeta meta;
  std::string global;                   // global bytes, row-major
  std::vector<std::string> per_device;  // local shards
};

}  // namespace

int RunDemo(const std::string& dir_arg, bool keep) {
  namespace fs = std::filesystem;
  std::string root = dir_arg;
  if (root.empty()) {
    char tmpl[] = "/tmp/tessera-demo-XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::perror("mkdtemp");
      return 1;
    }
    root = tmpl;
  }
  storage::Env* env = storage::DefaultEnv();
  Mesh mesh{"demo", {{"data", 2}, {"model", 2}}, 1};
  std::printf("tessera demo: mesh %s %s, checkpoint root %s\n", mesh.name.c_str(),
              mesh.ToString().c_str(), root.c_str());

  auto layout = [](std::vector<std::string> dims) { return Layout{std::move(dims)}; };
  std::vector<DemoTensor> tensors = {
      {{"embedding", DType::kFloat32, {4096, 256}, layout({"unsharded", "model"})}, {}, {}},
      {{"dense/kernel", DType::kBFloat16, {1024, 1024}, layout({"data", "model"})}, {}, {}},
      {{"dense/bias", DType::kFloat16, {1024}, layout({"unsharded"})}, {}, {}},
      {{"optimizer/step", DType::kInt64, {}, layout({})}, {}, {}},
      {{"optimizer/momentum", DType::kFloat64, {256, 64}, layout({"data", "unsharded"})}, {}, {}},
      {{"tokens", DType::kInt32, {512, 128}, layout({"data", "model"})}, {}, {}},
      {{"mask", DType::kBool, {128, 128}, layout({"model", "data"})}, {}, {}},
      {{"quantized/w", DType::kInt8, {512, 512}, layout({"unsharded", "data"})}, {}, {}},
      {{"quantized/scale", DType::kUInt8, {512}, layout({"model"})}, {}, {}},
      {{"histogram", DType::kInt16, {64, 64}, layout({"unsharded", "unsharded"})}, {}, {}},
  };
  std::vector<storage::TensorMeta> metas;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& t = tensors[i];
    t.global = storage::SyntheticBytes(t.meta.dtype, NumElements(t.meta.shape), 1000 + i);
    const size_t esize = DTypeSize(t.meta.dtype);
    for (int64_t d = 0; d < mesh.num_devices(); ++d) {
      SliceSpec s = DeviceSlice(mesh, t.meta.layout, t.meta.shape, d);
      std::string local(s.NumElements() * esize, '\0');
      storage::CopyOverlap(FullSlice(t.meta.shape), t.global.data(), s, local.data(), esize);
      t.per_device.push_back(std::move(local));
    }
    metas.push_back(t.meta);
  }

  storage::ThreadPool pool(2);
  storage::SaveRequest req;
  req.root = root;
  req.mesh = mesh;
  req.step = 100;
  req.tensors = metas;
  req.source = [&](size_t t, int64_t d) -> const void* { return tensors[t].per_device[d].data(); };
  req.options.pool = &pool;
  req.metadata = {{"note", "tessera demo"}};
  auto t0 = Clock::now();
  auto saved = storage::SaveCheckpoint(env, req);
  if (!saved.ok()) {
    std::fprintf(stderr, "save failed: %s\n", saved.status().ToString().c_str());
    return 1;
  }
  std::printf("\n[save] step %lld committed to %s in %.1f ms\n", static_cast<long long>(req.step),
              saved->dir.c_str(), MsSince(t0));
  std::printf("       logical %s, written once %s, stored %s (zstd-1)\n",
              HumanBytes(saved->logical_bytes).c_str(),
              HumanBytes(saved->written_raw_bytes).c_str(), HumanBytes(saved->stored_bytes).c_str());
  for (size_t r = 0; r < saved->bytes_per_rank.size(); ++r) {
    std::printf("       rank %zu wrote %s\n", r, HumanBytes(saved->bytes_per_rank[r]).c_str());
  }

  std::printf("\n[inspect]\n");
  if (RunInspect(saved->dir, false) != 0) return 1;
  std::printf("\n[verify] ");
  std::fflush(stdout);
  if (RunVerify(saved->dir, false, 2) != 0) return 1;

  // Read back: whole tensors, every device shard of the saved mesh, and the
  // shards of another mesh {data:4} with every dimension sharded on data where possible.
  Mesh other{"demo4", {{"data", 4}}, 1};
  int mismatches = 0;
  uint64_t reads = 0;
  t0 = Clock::now();
  for (const auto& t : tensors) {
    const size_t esize = DTypeSize(t.meta.dtype);
    auto whole = storage::ReadSlice(env, saved->dir, t.meta.name, FullSlice(t.meta.shape));
    if (!whole.ok() || *whole != t.global) {
      std::printf("MISMATCH %s (whole): %s\n", t.meta.name.c_str(),
                  whole.ok() ? "bytes differ" : whole.status().ToString().c_str());
      ++mismatches;
    }
    ++reads;
    Layout target = Layout::Replicated(t.meta.shape.size());
    if (!t.meta.shape.empty() && t.meta.shape[0] % 4 == 0) target.dims[0] = "data";
    for (int64_t d = 0; d < other.num_devices(); ++d) {
      SliceSpec s = DeviceSlice(other, target, t.meta.shape, d);
      std::string expect(s.NumElements() * esize, '\0');
      storage::CopyOverlap(FullSlice(t.meta.shape), t.global.data(), s, expect.data(), esize);
      auto got = storage::ReadSlice(env, saved->dir, t.meta.name, s);
      ++reads;
      if (!got.ok() || *got != expect) {
        std::printf("MISMATCH %s on %s device %lld\n", t.meta.name.c_str(),
                    other.ToString().c_str(), static_cast<long long>(d));
        ++mismatches;
      }
    }
  }
  std::printf("\n[restore] %llu reads (whole tensors, and resharded onto %s) in %.1f ms: %s\n",
              static_cast<unsigned long long>(reads), other.ToString().c_str(), MsSince(t0),
              mismatches == 0 ? "every byte matches" : "MISMATCHES");
  if (!keep && dir_arg.empty()) {
    std::error_code ec;
    fs::remove_all(root, ec);
  } else {
    std::printf("checkpoint kept at %s (try: tessera inspect %s)\n", saved->dir.c_str(),
                saved->dir.c_str());
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace tessera::tools
