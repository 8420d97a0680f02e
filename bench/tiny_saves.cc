// The control plane's scale: saves of a tiny state (4 KiB per worker), REST call to
// commit, against the number of workers, with tesserad's CPU time and the workers'
// requests to tesserad per save (bench/server_requests.h).
#include "bench/tiny_saves.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "bench/cluster_util.h"
#include "bench/memory_data_env.h"
#include "bench/server_requests.h"
#include "bench/stats.h"
#include "storage/synthetic.h"

namespace tessera::bench {
namespace {

// CPU seconds (user + system) a process has used so far, from /proc/PID/stat.
double CpuSeconds(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char buf[1024] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  // Fields after the command name, which ends at the last ')': state is field 3,
  // utime and stime are 14 and 15.
  const char* p = std::strrchr(buf, ')');
  if (!p || static_cast<size_t>(p - buf) >= n) return 0;
  unsigned long long utime = 0, stime = 0;
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                  &stime) != 2) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Saves of 4 KiB per worker, REST call to commit: what the control plane costs
// per save as the mesh grows. Median of `saves` runs, plus the phases of the last
// and tesserad's CPU time per save (over all of them).
void TinySaves(tools::LocalCluster& c, const std::string& mesh, int workers, const std::string& kind,
               const std::string& env_name, int saves, const std::function<void()>& push) {
  push();
  std::vector<double> ms;
  Json phases;
  const double cpu0 = CpuSeconds(c.server_pid());
  const auto requests0 = WorkerRequests(c);
  for (int i = 0; i < saves; ++i) {
    auto t0 = Clock::now();
    Json started = Check(c.Call("POST", "/api/v1/meshes/" + mesh + "/checkpoints",
                                {{"step", i + 1}, {"compression", "none"}}),
                         "tiny save");
    Json done = WaitJob(c, started["job"]);
    ms.push_back(Secs(t0) * 1e3);
    phases = done["timings_ms"];
  }
  const double cpu_ms_per_save = (CpuSeconds(c.server_pid()) - cpu0) * 1e3 / saves;
  // What tesserad spends with no save running (the workers' heartbeats and long-polls),
  // over as long as a save took: the part of a save's CPU that is not the save's.
  const double idle0 = CpuSeconds(c.server_pid());
  const auto quiet = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(Median(ms)));
  const double idle_ms = (CpuSeconds(c.server_pid()) - idle0) * 1e3 * Median(ms) /
                         std::max(1.0, Secs(quiet) * 1e3);
  double requests = 0;
  const auto by_route = RequestsSince(requests0, WorkerRequests(c), &requests);
  EmitLine({{"bench", "tiny_save"}, {"workers", workers}, {"kind", kind}, {"saves", saves},
            {"server_cpu_ms_per_save", cpu_ms_per_save},
            {"server_cpu_ms_per_worker_save", cpu_ms_per_save / workers},
            {"server_idle_cpu_ms_per_save_time", idle_ms},
            {"server_net_cpu_ms_per_worker_save", std::max(0.0, cpu_ms_per_save - idle_ms) / workers},
            {"requests_per_worker_save", requests / (static_cast<double>(workers) * saves)},
            {"requests_by_route", by_route}, {"env", env_name},
            {"p50_ms", Median(ms)}, {"min_ms", *std::min_element(ms.begin(), ms.end())},
            {"max_ms", *std::max_element(ms.begin(), ms.end())}, {"phases_ms", phases}});
}

void TinySavesOfProcesses(const tools::ClusterOptions& base, int workers, int saves) {
  tools::ClusterOptions opts = base;
  opts.dir = base.dir + "-tiny" + std::to_string(workers);
  opts.workers = workers;
  opts.server_threads = 4 * workers + 64;
  auto cluster = Check(tools::LocalCluster::Start(opts), "start cluster");
  auto& c = *cluster;
  Check(c.PutMesh("tiny", {{{"name", "data"}, {"size", workers}}}), "register tiny mesh");
  TinySaves(c, "tiny", workers, "processes", "disk", saves, [&] {
    const std::string shard = storage::SyntheticBytes(DType::kFloat32, 1024, 5);
    for (int w = 0; w < workers; ++w) {
      http::Client local = c.WorkerClient(w);
      auto r = local.Send("PUT", "/v1/tensors/x?mesh=tiny&device=" + std::to_string(w) +
                                     "&dtype=float32&shape=" + std::to_string(1024 * workers) +
                                     "&layout=data",
                          shard, "application/octet-stream");
      if (!r.ok() || r->status != 204) Die("push tiny", r.ok() ? Internal(r->body) : r.status());
    }
  });
  cluster.reset();
  std::error_code ec;
  std::filesystem::remove_all(opts.dir, ec);
}

// In-process agents (real registration, tasks, reports, writes and merge; no
// process per rank): the same tiny saves for meshes larger than this machine
// can run as processes.
void TinySavesOfAgents(const tools::ClusterOptions& base, int ranks, int saves, bool memory) {
  tools::ClusterOptions opts = base;
  opts.dir = base.dir + "-sim" + std::to_string(ranks) + (memory ? "-mem" : "");
  opts.workers = 0;
  opts.server_threads = std::min(4 * ranks + 64, 4096);  // tesserad takes at most 4096
  auto cluster = Check(tools::LocalCluster::Start(opts), "start cluster");
  auto& c = *cluster;
  worker::TensorStoreOptions so;
  so.copy_threads = 1;
  MemoryDataEnv memory_env;
  InProcessAgents sim(c, ranks, "sim-", so,
                      memory ? static_cast<storage::Env*>(&memory_env) : storage::DefaultEnv());
  auto& stores = sim.stores;
  Check(c.Call("PUT", "/api/v1/meshes/sim",
               {{"axes", {{{"name", "d"}, {"size", ranks}}}}, {"workers", sim.ids}, {"self_test", false}}),
        "register sim mesh");
  TinySaves(c, "sim", ranks, "in-process", memory ? "unsynced" : "disk", saves, [&] {
    const std::string shard = storage::SyntheticBytes(DType::kFloat32, 1024, 5);
    for (int r = 0; r < ranks; ++r) {
      worker::TensorDesc desc{DType::kFloat32, {int64_t{1024} * ranks}, Layout{{"d"}}};
      if (auto st = stores[r]->Put("sim", "x", desc, r, shard); !st.ok()) Die("put", st);
    }
  });
  sim.Stop();
  sim.agents.clear();
  cluster.reset();
  std::error_code ec;
  std::filesystem::remove_all(opts.dir, ec);
}

}  // namespace

void RunTinySaves(const tools::ClusterOptions& opts, const std::vector<int>& workers,
                  bool memory_env) {
  for (int n : workers) {
    if (n <= 32) {
      TinySavesOfProcesses(opts, n, 7);
    } else {
      TinySavesOfAgents(opts, n, 5, /*memory=*/false);
      if (memory_env) TinySavesOfAgents(opts, n, 5, /*memory=*/true);
    }
  }
}

}  // namespace tessera::bench
