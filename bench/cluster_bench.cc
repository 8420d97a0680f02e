// Cluster benchmark: a real local cluster (tesserad + 4 workers) checkpointing
// ~1 GiB of state held in the workers' shared-memory mappings, as trainers
// would keep it. Prints one JSON object per line:
//   memcpy       the stall's physical bound: copying one worker's share
//   stall        how long /v1/save holds up each trainer (rep 0 and steady)
//   save         first /v1/save until committed, logical GB/s (zstd-1, none)
//   restore      same mesh; reshard onto another mesh and layout
//   heartbeat    500 simulated workers at 1 Hz: latency p50 / p99
//   save64       one save across 64 simulated ranks (in-process agents)
//   tiny_save    save latency of a tiny state (4 KiB per worker) against the number
//                of workers: real worker processes (4, 16, 32) and in-process
//                agents (64, 256, 1024), with the job's phases and tesserad's CPU
//                time and the workers' requests per save (bench/tiny_saves.cc)
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "http/client.h"
#include "http/router.h"
#include "storage/env.h"
#include "storage/synthetic.h"
#include "tools/local_cluster.h"
#include "worker/agent.h"
#include "worker/tensor_store.h"
#include "bench/cluster_util.h"
#include "bench/stats.h"
#include "bench/tiny_saves.h"

using namespace tessera;
using tessera::bench::Clock;

namespace {

using tessera::bench::Check;
using tessera::bench::Die;
using tessera::bench::InProcessAgents;
using tessera::bench::Median;
using tessera::bench::Secs;
using tessera::bench::WaitJob;
using tessera::bench::Percentile;
using tessera::bench::EmitLine;

// The same 64 tensors as the torch.save peer: (912*k, 1024) float32, k = i%8+1.
struct Mapped {
  std::string name;
  int64_t rows;
  std::vector<std::pair<uint8_t*, size_t>> shards;  // by worker
};

// Each save writes into a store without the previous one, as each run of
// tessera_bench_storage writes into a fresh root: both then write into page-cache
// pages the kernel has just freed, and the ratio compares like with like.
void DeletePrevious(tools::LocalCluster& c, int64_t step) {
  if (step > 1) {
    Check(c.Call("DELETE", "/api/v1/meshes/bench/checkpoints/" + std::to_string(step - 1)),
          "delete checkpoint " + std::to_string(step - 1));
  }
}

void BenchHeartbeats(tools::LocalCluster& c, int workers, double seconds) {
  // Register simulated workers, then heartbeat each once per second from a few threads.
  std::vector<std::string> ids;
  {
    http::Client client(c.url(), c.token());
    for (int i = 0; i < workers; ++i) {
      Json r = Check(client.Call("POST", "/api/v1/workers",
                                 {{"local_port", 1}, {"name", "sim-" + std::to_string(i)}}),
                     "register simulated worker");
      ids.push_back(r["id"]);
    }
  }
  const int threads = 16;
  std::vector<std::vector<double>> lat(threads);
  std::vector<std::thread> ts;
  auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      http::Client client(c.url(), c.token(), 10);
      for (int round = 0; Secs(start) < seconds; ++round) {
        auto round_start = start + std::chrono::milliseconds(1000 * round);
        for (size_t i = t; i < ids.size(); i += threads) {
          // Spread each thread's workers over the second.
          auto when = round_start + std::chrono::microseconds(1000000 * (i / threads) * threads / ids.size());
          std::this_thread::sleep_until(when);
          auto t0 = Clock::now();
          auto r = client.Call("POST", "/api/v1/workers/" + ids[i] + "/heartbeat");
          if (r.ok()) lat[t].push_back(Secs(t0) * 1e3);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  EmitLine({{"bench", "heartbeat"}, {"workers", workers}, {"rate_hz", 1}, {"requests", all.size()},
        {"p50_ms", Percentile(all, 0.5)}, {"p99_ms", Percentile(all, 0.99)},
        {"max_ms", Percentile(all, 1.0)}});
  http::Client client(c.url(), c.token());
  for (const auto& id : ids) (void)client.Call("DELETE", "/api/v1/workers/" + id);
}

void BenchSave64(tools::LocalCluster& c, int ranks) {
  InProcessAgents sim(c, ranks, "rank-");
  auto& stores = sim.stores;
  // No registration self-test: it is a collective over the workers' data ports,
  // which these in-process agents do not open (no MeshCollectives), and it is not
  // what this measures.
  Check(c.Call("PUT", "/api/v1/meshes/sim64",
               {{"axes", {{{"name", "d"}, {"size", ranks}}}},
                {"workers", sim.ids},
                {"self_test", false}}),
        "register sim64");
  // 16 tensors of 64 rows x 4096 float32 per rank: 16 MiB per rank, 1 GiB total.
  const Mesh mesh{"sim64", {{"d", ranks}}, 1};
  const int64_t rows_per_rank = 64;
  std::string shard = storage::SyntheticBytes(DType::kFloat32, rows_per_rank * 4096, 7);
  for (int r = 0; r < ranks; ++r) {
    for (int t = 0; t < 16; ++t) {
      worker::TensorDesc desc{DType::kFloat32, {rows_per_rank * ranks, 4096}, Layout{{"d", "unsharded"}}};
      if (auto st = stores[r]->Put("sim64", "t" + std::to_string(t), desc, r, shard); !st.ok()) {
        Die("put", st);
      }
    }
  }
  auto t0 = Clock::now();
  Json started = Check(c.Call("POST", "/api/v1/meshes/sim64/checkpoints", {{"step", 1}}), "save64");
  Json done = WaitJob(c, started["job"]);
  double secs = Secs(t0);
  uint64_t bytes = done["result"]["checkpoint"]["logical_bytes"];
  EmitLine({{"bench", "save64"}, {"ranks", ranks}, {"bytes", bytes}, {"time_s", secs},
        {"GBps", bytes / secs / 1e9}});
  sim.Stop();
  for (const auto& id : sim.ids) (void)c.Call("DELETE", "/api/v1/workers/" + id.get<std::string>());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera cluster benchmark"};
  double scale = 1.0;
  int repeat = 3;
  std::string dir = ".";
  bool skip_scale = false;
  bool only_scale = false;
  app.add_option("--scale", scale, "fraction of the 1 GiB state");
  app.add_option("--repeat", repeat, "saves per setting");
  app.add_option("--dir", dir, "where the cluster keeps its checkpoints");
  app.add_flag("--skip-control-plane", skip_scale, "skip the heartbeat and 64-rank benchmarks");
  app.add_flag("--only-control-plane", only_scale, "only the tiny-save scale benchmarks");
  std::vector<int> tiny = {4, 16, 32, 64, 256, 1024};
  app.add_option("--tiny", tiny,
                 "worker counts of the tiny-save benchmarks: processes up to 32, in-process "
                 "agents beyond")
      ->delimiter(',');
  bool memory_env = false;
  app.add_flag("--memory-env", memory_env,
               "also run the in-process agents' tiny saves with their shard files never synced");
  std::string root, s3_endpoint;
  app.add_option("--checkpoint-root", root,
                 "checkpoints elsewhere (s3://BUCKET/PREFIX): then only save and restore run, "
                 "as s3_save and s3_restore");
  app.add_option("--s3-endpoint", s3_endpoint, "the S3 server of an s3:// root");
  CLI11_PARSE(app, argc, argv);
  const bool s3 = !root.empty();
  if (s3) skip_scale = true;

  tools::ClusterOptions opts;
  opts.bin_dir = tools::SelfDir();
  opts.dir = dir + "/cluster-bench-" + std::to_string(::getpid());
  opts.heartbeat_ms = 500;
  opts.lease_ms = 5000;
  opts.checkpoint_root = root;
  if (!s3_endpoint.empty()) opts.server_args = {"--s3-endpoint", s3_endpoint};
  if (!skip_scale) {
    tessera::bench::RunTinySaves(opts, tiny, memory_env);
  }
  if (only_scale) return 0;
  auto cluster = Check(tools::LocalCluster::Start(opts), "start cluster");
  auto& c = *cluster;
  const Mesh mesh{"bench", {{"data", 4}}, 1};
  Check(c.PutMesh("bench", MeshToJson(mesh)["axes"]), "register mesh");

  // Trainers keep their state in the workers' mappings.
  std::vector<Mapped> tensors;
  uint64_t total = 0, per_worker = 0;
  for (int i = 0; i < 64; ++i) {
    Mapped m{"layer" + std::to_string(i) + ".weight",
             std::max<int64_t>(4, static_cast<int64_t>(912 * (i % 8 + 1) * scale) / 4 * 4), {}};
    for (int w = 0; w < 4; ++w) {
      http::Client local = c.WorkerClient(w);
      Json r = Check(local.Call("POST", "/v1/tensors/" + m.name + "/mapping?mesh=bench&device=" +
                                            std::to_string(w) + "&dtype=float32&shape=" +
                                            std::to_string(m.rows) + ",1024&layout=data,unsharded",
                                Json::object()),
                     "map " + m.name);
      int fd = ::open(r["path"].get<std::string>().c_str(), O_RDWR);
      size_t n = r["bytes"];
      auto* p = static_cast<uint8_t*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      ::close(fd);
      storage::FillSynthetic(DType::kFloat32, n / 4, i * 4 + w, p);
      m.shards.push_back({p, n});
      total += n;
      if (w == 0) per_worker += n;
    }
    tensors.push_back(std::move(m));
  }

  // The stall's bound: copying one worker's share into memory already faulted in.
  if (!s3) {
    std::vector<uint8_t> dst(per_worker);
    std::vector<double> t1, t4;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = Clock::now();
      size_t off = 0;
      for (auto& m : tensors) {
        std::memcpy(dst.data() + off, m.shards[0].first, m.shards[0].second);
        off += m.shards[0].second;
      }
      t1.push_back(Secs(t0));
    }
    // Four copies at once, as four workers snapshot together on this machine.
    std::vector<std::vector<uint8_t>> dsts(4, std::vector<uint8_t>(per_worker, 1));
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      std::vector<std::thread> ts;
      for (int w = 0; w < 4; ++w) {
        ts.emplace_back([&, w] {
          size_t off = 0;
          for (auto& m : tensors) {
            std::memcpy(dsts[w].data() + off, m.shards[w].first, m.shards[w].second);
            off += m.shards[w].second;
          }
        });
      }
      for (auto& t : ts) t.join();
      t4.push_back(Secs(t0));
    }
    EmitLine({{"bench", "memcpy"}, {"bytes_per_worker", per_worker}, {"one_worker_ms", Median(t1) * 1e3},
          {"four_workers_at_once_ms", Median(t4) * 1e3}, {"GBps_one", per_worker / Median(t1) / 1e9}});
  }

  int64_t step = 0;
  for (const std::string compression : {"zstd", "none"}) {
    for (int rep = 0; rep < repeat; ++rep) {
      ++step;
      DeletePrevious(c, step);
      std::vector<double> stall(4);
      std::vector<Json> answers(4);
      auto t0 = Clock::now();
      std::vector<std::thread> trainers;
      for (int w = 0; w < 4; ++w) {
        trainers.emplace_back([&, w] {
          auto s = Clock::now();
          http::Client local = c.WorkerClient(w, 600);
          auto r = local.Call("POST", "/v1/save?mesh=bench&step=" + std::to_string(step),
                              {{"compression", compression}});
          stall[w] = Secs(s);
          answers[w] = r.ok() ? *r : ErrorBody(r.status());
        });
      }
      for (auto& t : trainers) t.join();
      if (!answers[0].contains("snapshot_ms")) Die("save", Internal(answers[0].dump()));
      std::vector<double> snap;
      for (auto& a : answers) snap.push_back(a.value("snapshot_ms", 0.0));
      http::Client local = c.WorkerClient(0, 600);
      Json started = Check(local.Call("GET", "/v1/saves/" + std::to_string(step) +
                                                 "?mesh=bench&wait=started"),
                           "save job");
      Json done = WaitJob(c, started["job"]);
      double secs = Secs(t0);
      const Json& ck = done["result"]["checkpoint"];
      EmitLine({{"bench", s3 ? "s3_save" : "save"}, {"compression", compression}, {"rep", rep},
            {"bytes", total},
            {"time_s", secs}, {"GBps", total / secs / 1e9},
            {"stall_ms_max", *std::max_element(stall.begin(), stall.end()) * 1e3},
            {"stall_ms_median", Median(stall) * 1e3},
            {"snapshot_ms_max", *std::max_element(snap.begin(), snap.end())},
            {"stored_bytes", ck["stored_bytes"]},
            {"ratio", ck["logical_bytes"].get<double>() / ck["stored_bytes"].get<double>()},
            {"phases_ms", done["timings_ms"]}});
    }
  }

  // One trainer at a time: each stall is one worker's copy with the machine to
  // itself. The job completes once the fourth has called.
  if (!s3) {
    std::vector<double> per_save;  // median over trainers, per save
    for (int rep = 0; rep < 3; ++rep) {
      ++step;
      DeletePrevious(c, step);
      std::vector<double> stall;
      for (int w = 0; w < 4; ++w) {
        http::Client local = c.WorkerClient(w, 600);
        auto s = Clock::now();
        auto r = local.Call("POST", "/v1/save?mesh=bench&step=" + std::to_string(step),
                            {{"compression", "none"}});
        stall.push_back(Secs(s) * 1e3);
        if (!r.ok()) Die("solo save", r.status());
      }
      http::Client local = c.WorkerClient(0, 600);
      Json started = Check(local.Call("GET", "/v1/saves/" + std::to_string(step) +
                                                 "?mesh=bench&wait=started"),
                           "solo save job");
      WaitJob(c, started["job"]);
      per_save.push_back(Median(stall));
    }
    EmitLine({{"bench", "solo_stall"}, {"steady_ms", Median(per_save)}, {"per_save_ms", per_save}});
  }
  for (int rep = 0; rep < repeat; ++rep) {
    auto t0 = Clock::now();
    Json r = Check(c.Call("POST", "/api/v1/meshes/bench/checkpoints/latest/restore", Json::object()),
                   "restore");
    WaitJob(c, r["job"]);
    double secs = Secs(t0);
    EmitLine({{"bench", s3 ? "s3_restore" : "restore"}, {"rep", rep}, {"bytes", total},
          {"time_s", secs}, {"GBps", total / secs / 1e9}});
  }
  if (s3) {  // the rest is about the control plane and the local disk
    cluster.reset();
    std::error_code ec;
    std::filesystem::remove_all(opts.dir, ec);
    return 0;
  }
  // Reshard: the same tensors onto a {x:2, y:2} mesh, sharded over both axes.
  Check(c.PutMesh("grid", {{{"name", "x"}, {"size", 2}}, {{"name", "y"}, {"size", 2}}}), "grid");
  Json layouts = Json::object();
  for (auto& m : tensors) layouts[m.name] = {"x", "y"};
  for (int rep = 0; rep < repeat; ++rep) {
    auto t0 = Clock::now();
    Json r = Check(c.Call("POST", "/api/v1/meshes/bench/checkpoints/latest/restore",
                          {{"target_mesh", "grid"}, {"layouts", layouts}}),
                   "reshard");
    Json done = WaitJob(c, r["job"]);
    double secs = Secs(t0);
    EmitLine({{"bench", "reshard"}, {"rep", rep}, {"bytes", total}, {"time_s", secs},
          {"GBps", total / secs / 1e9}, {"stored_bytes_read", done["result"]["stored_bytes_read"]}});
  }
  for (auto& m : tensors) {
    for (auto& [p, n] : m.shards) ::munmap(p, n);
  }
  if (!skip_scale) {
    BenchHeartbeats(c, 500, 10.0 * std::min(1.0, scale * 4));
    BenchSave64(c, 64);
  }
  cluster.reset();  // stop the processes before removing their files
  std::error_code ec;
  std::filesystem::remove_all(opts.dir, ec);
  return 0;
}
