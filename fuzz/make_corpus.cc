// Writes the seed corpora of the fuzz targets: real, valid inputs, named
// seed-<what>, into <dir>/<target>/. Regression inputs (regress-*) are kept by
// hand next to them and are not touched.
//
//   build/bin/fuzz_make_corpus fuzz/corpus
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "api/base64.h"
#include "api/json_codec.h"
#include "fuzz/checkpoint_inputs.h"
#include "storage/safetensors_format.h"

namespace {

namespace fs = std::filesystem;

void Put(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / ("seed-" + name), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

// Request bodies as clients send them (README.md, docs/openapi.json, examples/).
const std::vector<std::pair<std::string, std::string>> kBodies = {
    {"mesh", R"({"axes":[{"name":"data","size":2},{"name":"model","size":2}],"workers":["w-host0","w-host1","w-host2","w-host3"]})"},
    {"mesh-named", R"({"name":"demo","axes":[{"name":"data","size":4}],"devices_per_worker":2,"self_test":false})"},
    {"save", R"({"step":100,"tensors":["layer0/w","bias"],"compression":"zstd","level":3,"metadata":{"note":"from curl","epoch":2}})"},
    {"save-empty", R"({})"},
    {"restore", R"({"target_mesh":"data4","tensors":[{"name":"layer0/w","dtype":"float32","shape":[8,4]}],"layouts":{"layer0/w":["data",null]}})"},
    {"retention", R"({"keep_last":3})"},
    {"barrier", R"({"rank":0,"world":4,"timeout_ms":30000})"},
    {"preemption-sync", R"({"step":7,"timeout_ms":10000,"worker":"w-host0"})"},
    {"collective", R"({"op":"all_reduce","axes":["data"],"dtype":"float32","shape":[4],"reduce":"sum"})"},
    {"tensor-spec", R"({"mesh":{"name":"m","axes":[{"name":"data","size":2},{"name":"model","size":2}],"devices_per_worker":1},"shape":[64,32],"layout":["data","model"],"dtype":"bfloat16"})"},
    {"tensor-replicated", R"({"mesh":{"name":"m","axes":[{"name":"x","size":4}]},"shape":[3,5],"layout":["unsharded",null],"dtype":"int64"})"},
    {"slice", R"({"offsets":[0,16],"lengths":[32,16]})"},
    {"shape", R"([8,4])"},
    {"layout", R"(["data","unsharded"])"},
    {"dtype", R"("bfloat16")"},
    {"base64", "\"" + tessera::Base64Encode("10.0.0.1:29500") + "\""},
    {"shape-text", R"("64,32")"},
    {"layout-text", R"("model,data")"},
    {"name", R"("layer0/attention.q_proj-weight")"},
    {"report", R"({"state":"done","bytes":1024,"result":{"files":["shard-0.tsr"]},"error":null})"},
};

// method, request target, body.
const std::vector<std::pair<std::string, std::string>> kRequests = {
    {"healthz", "GET\n/healthz\n"},
    {"put-mesh", "PUT\n/api/v1/meshes/demo\n" + kBodies[0].second},
    {"save", "POST\n/api/v1/meshes/demo/checkpoints\n{\"step\":100}"},
    {"job-wait", "GET\n/api/v1/jobs/j-4f2a?wait_ms=10000\n"},
    {"restore", "POST\n/api/v1/meshes/demo/checkpoints/latest/restore\n{\"target_mesh\":\"demo\"}"},
    {"verify", "POST\n/api/v1/meshes/team%2Fdemo/checkpoints/100/verify\n{}"},
    {"delete-step", "DELETE\n/api/v1/meshes/a/b/checkpoints/7\n"},
    {"retention", "PUT\n/api/v1/meshes/demo/retention\n{\"keep_last\":3}"},
    {"barrier", "POST\n/api/v1/barriers/job/ready\n{\"rank\":0,\"world\":4,\"timeout_ms\":30000}"},
    {"kv-put", "PUT\n/api/v1/kv/job/coordinator\n10.0.0.1:29500"},
    {"kv-get", "GET\n/api/v1/kv/job/coordinator?wait_ms=10000\n"},
    {"kv-list", "GET\n/api/v1/kv?prefix=job%2F\n"},
    {"jobs", "GET\n/api/v1/jobs?state=running&kind=save&mesh=demo&limit=20\n"},
    {"preemption", "POST\n/api/v1/meshes/demo/preemption\n{\"reason\":\"maintenance\"}"},
    {"events", "GET\n/api/v1/events?token=abc\n"},
    {"asset", "GET\n/assets/js/views/meshes.js\n"},
    {"worker-tasks", "GET\n/api/v1/workers/w-host0/tasks?wait_ms=20000\n"},
    {"task-report", "POST\n/api/v1/workers/w-host0/tasks/t-9/report\n{\"state\":\"done\"}"},
    {"local-put", "PUT\n/v1/tensors/layer0/w?mesh=demo&device=0&dtype=float32&shape=8,4&layout=data,model\n"},
    {"local-mapping", "POST\n/v1/tensors/layer0/w/mapping?mesh=demo&device=1&dtype=bfloat16&shape=16&layout=unsharded\n"},
    {"local-get", "GET\n/v1/tensors/layer0%2Fw?mesh=data4&device=1\n"},
    {"local-save", "POST\n/v1/save?mesh=demo&step=12&wait=committed\n{\"deadline_ms\":60000}"},
    {"local-saves", "GET\n/v1/saves/12?mesh=demo&wait=started&timeout_ms=5000\n"},
    {"local-restore", "POST\n/v1/restore?mesh=demo&step=latest\n{}"},
    {"collective", "POST\n/v1/collectives/all_reduce?mesh=demo&axes=data&dtype=float32&shapes=4,2&reduce=sum\n"},
    {"local-barrier", "POST\n/v1/barriers/after-step-1?mesh=demo\n{}"},
    {"local-preemption", "GET\n/v1/preemption?mesh=demo&step=8&timeout_ms=1000\n"},
};

// Edits of a real index, as damage or a foreign writer would make them.
const std::vector<std::pair<std::string, std::string>> kIndexEdits = {
    {"sql-select", "SELECT count(*) FROM chunks"},
    {"sql-chunk-length", "UPDATE chunks SET length = length + 1 WHERE rowid = 3"},
    {"sql-chunk-offset", "UPDATE chunks SET offset = 40 WHERE rowid = 2"},
    {"sql-chunk-codec", "UPDATE chunks SET codec = 1 - codec WHERE rowid = 5"},
    {"sql-chunk-raw-length", "UPDATE chunks SET raw_length = 256 WHERE rowid = 1"},
    {"sql-chunk-delete", "DELETE FROM chunks WHERE rowid = 4"},
    {"sql-slice-offsets", "UPDATE slices SET offsets = '32,0' WHERE id = 1"},
    {"sql-slice-file", "UPDATE slices SET file = 'shard-1.tsr' WHERE id = 2"},
    {"sql-tensor-shape", "UPDATE tensors SET shape = '64,16', elements = 1024 WHERE name = 'w'"},
    {"sql-tensor-dtype", "UPDATE tensors SET dtype = 'int32' WHERE name = 'bias'"},
    {"sql-tensor-layout", "UPDATE tensors SET layout = 'unsharded' WHERE name = 'bias'"},
    {"sql-meta-mesh", "UPDATE meta SET value = '{\"name\":\"m\",\"axes\":[{\"name\":\"data\",\"size\":4}],"
                      "\"devices_per_worker\":2}' WHERE key = 'mesh'"},
    {"sql-meta-version", "UPDATE meta SET value = '2' WHERE key = 'format_version'"},
    {"sql-meta-metadata", "UPDATE meta SET value = '{\"note\":[1,2,{\"a\":null}]}' WHERE key = 'metadata'"},
    {"sql-insert-slice", "INSERT INTO slices SELECT id + 100, tensor_id, offsets, lengths, elements, file "
                         "FROM slices WHERE id = 1"},
    {"sql-drop-index", "DROP INDEX chunks_by_slice"},
    // An incremental checkpoint's chunk in an earlier checkpoint's file, and one that escapes.
    {"sql-chunk-ref", "UPDATE chunks SET file = '../step-1/shard-0.tsr' WHERE rowid = 2"},
    {"sql-chunk-ref-escape", "UPDATE chunks SET file = '../../etc/passwd' WHERE rowid = 3"},
};

// Bytes of `values` as the local API's bodies carry them (host order).
template <typename T>
std::string Raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Collective calls on a worker's local API: op, query, body (README.md,
// docs/openapi-worker.json, examples/12_collectives.sh); devices=N is the
// target's own parameter (local devices).
std::vector<std::pair<std::string, std::string>> CollectiveCalls() {
  auto call = [](const std::string& op, const std::string& query, const std::string& body) {
    return op + "\n" + query + "\n" + body;
  };
  return {
      {"all-reduce", call("all_reduce", "mesh=demo&axes=data&dtype=float32&shape=2&reduce=sum",
                          Raw<float>({1, 2}))},
      {"all-reduce-two-devices", call("all_reduce", "mesh=demo&dtype=int32&shape=2,1&devices=2",
                                      Raw<int32_t>({1, 2, 3, 4}))},
      {"batch", call("batch_all_reduce", "mesh=demo&dtype=float32&shapes=2;;1&bytes_per_pack=8",
                     Raw<float>({1, 2, 3, 4}))},
      {"process-allgather", call("process_allgather", "mesh=demo&dtype=int64&shape=&tiled=true&devices=3",
                                 Raw<int64_t>({7}))},
      {"barrier", call("barrier", "mesh=demo&name=after-step-1&local_devices=1", "")},
      {"sparse", call("sparse_all_reduce", "mesh=demo&dtype=int32&dense_shape=6,2&rows=2",
                      Raw<int32_t>({1, 2, 3, 4}) + Raw<int64_t>({5, 0}))},
      {"sparse-int32-two-devices",
       call("sparse_all_reduce",
            "mesh=demo&dtype=int32&dense_shape=4&rows=1,2&index_dtype=int32&path=gather&devices=2",
            Raw<int32_t>({9}) + Raw<int32_t>({3}) + Raw<int32_t>({1, 1}) + Raw<int32_t>({0, 0}))},
      {"sparse-out-of-range", call("sparse_all_reduce", "mesh=demo&dtype=int32&dense_shape=2&rows=1&path=dense",
                                   Raw<int32_t>({1}) + Raw<int64_t>({2}))},
      {"sparse-empty", call("sparse_all_reduce", "mesh=demo&dtype=float16&dense_shape=0,3&rows=0", "")},
  };
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  for (const auto& [name, body] : kBodies) Put(root / "rest_decoders", name, body);
  for (const auto& [name, request] : kRequests) Put(root / "route", name, request);
  for (const auto& [name, request] : CollectiveCalls()) Put(root / "collective_call", name, request);

  fuzz::SavedCheckpoint ck;
  for (int rank = 0; rank < 4; ++rank) {
    Put(root / "shard_reader", "shard-" + std::to_string(rank),
        std::string(1, static_cast<char>(rank)) + ck.Read(storage::ShardFileName(rank)));
  }
  Put(root / "index_reader", "index", ck.Read(storage::kIndexFile));
  for (const auto& [name, sql] : kIndexEdits) Put(root / "index_reader", name, sql);
  // Safetensors files as the exporter writes them (bytes zero: the header is the input).
  using storage::SafetensorsEntry;
  const std::vector<std::pair<std::string, std::vector<SafetensorsEntry>>> kSafetensors = {
      {"model", {{"model.embed.weight", DType::kBFloat16, {16, 8}, 256},
                 {"model.layers.0.bias", DType::kFloat32, {8}, 32},
                 {"step", DType::kInt64, {}, 8},
                 {"mask", DType::kBool, {3}, 3},
                 {"empty", DType::kFloat16, {0, 4}, 0}}},
      {"one", {{"w", DType::kFloat32, {2, 2}, 16}}},
      {"none", {}},
  };
  for (const auto& [name, entries] : kSafetensors) {
    uint64_t bytes = 0;
    for (const auto& e : entries) bytes += e.bytes;
    const Json meta = name == "model" ? Json{{"format", "pt"}, {"tessera.step", "7"}} : Json::object();
    Put(root / "safetensors_header", name,
        storage::EncodeSafetensorsHeader(entries, meta) + std::string(bytes, '\x01'));
  }
  std::printf("seed corpora written under %s\n", root.c_str());
  return 0;
}
