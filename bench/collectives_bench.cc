// Collectives benchmark, comparable with bench/peers/allreduce_torch_gloo.py and
// allreduce_mpi.c: the same sweep, the same method and the same JSON fields.
//
// N ranks are processes (fork) with their own TcpTransport on 127.0.0.1, like the
// peers' ranks; --transport inproc runs them as threads over InProcessTransport to
// show the engine without the network. Method (bench/peers/README.md): 2 warmup
// ops, a barrier, then clamp(64 MiB / bytes, 5, 200) ops back to back; each
// iteration's time is the max over ranks and the median is reported;
// algbw = bytes / time, busbw per NCCL-tests. Every iteration's result is
// verified (outside the timed region); a wrong result fails the run.
// Besides the peers' fields, every line has p99_us (nearest rank over the same
// per-iteration maxima), and the barrier line p50_us (= time_us) as well.
// sparse_all_reduce (no peer sweep; bench/sparse_torch_gloo.py measures torch
// Gloo's sparse all_reduce the same way): an embedding gradient, rows of
// [65536, 64] float32 at uniform random indices, every rank 4096 rows ("equal":
// the gather path) or rank r 2048·(r+1) rows ("unequal": the dense path).
//
//   tessera_bench_collectives [--ranks 4] [--transport tcp|inproc] [--min-bytes N]
//                             [--max-bytes N] [--algorithm A] [--chunk-bytes N] [--spin-us N]
//                             [--iters N]
//                             [--ops all_reduce,all_gather,broadcast,sparse_all_reduce,barrier]
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/transport/in_process_transport.h"
#include "collectives/local_mesh.h"
#include "collectives/sparse_all_reduce.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "bench/stats.h"

namespace tessera::collectives {
namespace {

using tessera::bench::Round;
using tessera::bench::Median;
using tessera::bench::Percentile;

constexpr size_t kSweepBytes = size_t{64} << 20;  // the peers' MAX_BYTES

struct Config {
  int ranks = 4;
  std::string transport = "tcp";
  size_t min_bytes = 4;
  size_t max_bytes = kSweepBytes;
  Options options;  // algorithm, thresholds, chunk size
  std::chrono::microseconds spin = TcpOptions().spin;
  int iters = 0;  // timed ops per size; 0: IterationsFor(bytes), as the peers
  // Ops to measure (all_reduce, all_gather, broadcast, sparse_all_reduce, barrier);
  // empty: every one.
  std::vector<std::string> ops;
  bool Wants(const std::string& op) const {
    return ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end();
  }
};

int IterationsFor(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>(kSweepBytes / std::max<size_t>(bytes, 1), 5, 200));
}

// Per-iteration times (seconds), each the slowest rank's.
struct Timing {
  double p50 = 0;  // the median, as the peers report it
  double p99 = 0;
};

// Untimed work around each op. `reset` restores the input before every op:
// the all-reduce works in place (Open MPI's out-of-place call copies its input
// inside the timed call instead). `clear` wipes the output before, and `check`
// verifies it after, the warm-up ops and the last one only: on 2 cores the
// ranks share the CPUs, so one rank's untimed work runs inside the other
// ranks' timed calls (checking every 1 MiB all-reduce made it 5-10% slower,
// zeroing every 16 MiB broadcast's output up to 1.5× slower), and the peers'
// loops neither clear nor check. The tests check every result.
struct Around {
  std::function<void()> reset = nullptr;
  std::function<void()> clear = nullptr;
  std::function<Status()> check = nullptr;
};

class Bench {
 public:
  Bench(Group& group, const Config& config) : group_(group), config_(config) {}

  Status Run() {
    const int n = group_.size();
    for (size_t bytes = 4; bytes <= config_.max_bytes && config_.Wants("all_reduce"); bytes *= 4) {
      if (bytes < config_.min_bytes) continue;
      RETURN_IF_ERROR(AllReduceSize(bytes));
    }
    for (size_t per_rank : {size_t{1} << 20, size_t{16} << 20}) {
      if (per_rank > config_.max_bytes) break;
      if (per_rank < config_.min_bytes) continue;
      if (config_.Wants("all_gather")) RETURN_IF_ERROR(AllGatherSize(per_rank));
      if (config_.Wants("broadcast")) RETURN_IF_ERROR(BroadcastSize(per_rank));
    }
    if (config_.min_bytes <= 4 && config_.Wants("sparse_all_reduce")) {
      RETURN_IF_ERROR(SparseCase("equal", [](int) { return int64_t{4096}; }));
      RETURN_IF_ERROR(SparseCase("unequal", [](int r) { return int64_t{2048} * (r + 1); }));
    }
    if (!config_.Wants("barrier")) return Status::Ok();
    BarrierOptions barrier;
    static_cast<Options&>(barrier) = config_.options;
    ASSIGN_OR_RETURN(Timing t,
                     Measure(500, 20, [&] { return Barrier(group_, barrier); }));
    if (group_.rank() == 0) {
      Print({{"bench", Name()},
             {"op", "barrier"},
             {"ranks", n},
             {"time_us", Round(t.p50 * 1e6, 1)},
             {"p50_us", Round(t.p50 * 1e6, 1)},
             {"p99_us", Round(t.p99 * 1e6, 1)},
             {"iters", 500},
             {"transport", config_.transport}});
    }
    return Status::Ok();
  }

 private:
  int Iterations(size_t bytes) const {
    return config_.iters > 0 ? config_.iters : IterationsFor(bytes);
  }
  std::string Name() const { return "tessera_" + config_.transport; }

  static void Print(const nlohmann::ordered_json& line) { std::cout << line.dump() << std::endl; }

  void Emit(const std::string& op, size_t bytes, const Timing& t, int iters,
            double bus_factor) const {
    if (group_.rank() != 0) return;
    const double algbw = static_cast<double>(bytes) / t.p50 / 1e9;
    Print({{"bench", Name()},
           {"op", op},
           {"ranks", group_.size()},
           {"bytes", bytes},
           {"time_us", Round(t.p50 * 1e6, 1)},
           {"algbw_GBps", Round(algbw, 4)},
           {"busbw_GBps", Round(algbw * bus_factor, 4)},
           {"iters", iters},
           {"p99_us", Round(t.p99 * 1e6, 1)},
           {"transport", config_.transport},
           {"algorithm", std::string(AlgorithmName(config_.options.algorithm))}});
  }

  // Median and p99 over `iters` of the slowest rank's time for `op`.
  Result<Timing> Measure(int iters, int warmup, const std::function<Status()>& op,
                         const Around& around = {}) {
    Tensor times = Tensor::Zeros(DType::kFloat64, {iters});
    for (int i = 0; i < warmup + iters; ++i) {
      if (i == warmup) RETURN_IF_ERROR(Barrier(group_));
      const bool checked = i < warmup || i == warmup + iters - 1;
      if (around.reset) around.reset();
      if (checked && around.clear) around.clear();
      const auto start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(op());
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (i >= warmup) times.values<double>()[i - warmup] = took.count();
      if (checked && around.check) RETURN_IF_ERROR(around.check());
    }
    AllReduceOptions max;
    max.op = ReduceOp::kMax;
    RETURN_IF_ERROR(AllReduce(group_, times, max));
    auto v = times.values<double>();
    const std::vector<double> all(v.begin(), v.end());
    return Timing{.p50 = Median(all), .p99 = Percentile(all, 0.99)};
  }

  // Looks for a mismatch without branching first (the loop vectorizes), then
  // names the first one.
  static Status ExpectAll(std::span<const float> values, float want, const std::string& what) {
    unsigned wrong = 0;
    for (float v : values) wrong |= static_cast<unsigned>(v != want);
    if (wrong == 0) return Status::Ok();
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] != want) {
        return DataLoss(what + ": element " + std::to_string(i) + " is " +
                        std::to_string(values[i]) + ", expected " + std::to_string(want));
      }
    }
    return Status::Ok();
  }

  Status AllReduceSize(size_t bytes) {
    const int n = group_.size();
    Tensor x = Tensor::Zeros(DType::kFloat32, {static_cast<int64_t>(bytes / 4)});
    AllReduceOptions o;
    static_cast<Options&>(o) = config_.options;
    const int iters = Iterations(bytes);
    ASSIGN_OR_RETURN(
        Timing t,
        Measure(iters, 2, [&] { return AllReduce(group_, x, o); },
                {.reset = [&] { std::fill(x.values<float>().begin(), x.values<float>().end(), 1.0f); },
                 .check = [&] {
                   return ExpectAll(x.values<float>(), static_cast<float>(n), "all_reduce");
                 }}));
    Emit("all_reduce", bytes, t, iters, 2.0 * (n - 1) / n);
    return Status::Ok();
  }

  Status AllGatherSize(size_t per_rank) {
    const int n = group_.size();
    Tensor x = Tensor::Zeros(DType::kFloat32, {static_cast<int64_t>(per_rank / 4)});
    std::fill(x.values<float>().begin(), x.values<float>().end(), group_.rank() + 1.0f);
    Tensor out;
    AllGatherOptions o;
    static_cast<Options&>(o) = config_.options;
    o.tiled = true;
    const int iters = Iterations(per_rank * n);
    auto verify = [&]() -> Status {
      auto all = out.values<float>();
      if (all.size() != per_rank / 4 * n) return DataLoss("all_gather: wrong output size");
      for (int r = 0; r < n; ++r) {
        RETURN_IF_ERROR(ExpectAll(all.subspan(r * per_rank / 4, per_rank / 4), r + 1.0f,
                                  "all_gather block " + std::to_string(r)));
      }
      return Status::Ok();
    };
    ASSIGN_OR_RETURN(Timing t,
                     Measure(iters, 2, [&] { return AllGatherInto(group_, x, out, o); },
                             {.clear = [&] { std::fill(out.data.begin(), out.data.end(), 0); },
                              .check = verify}));
    Emit("all_gather", per_rank * n, t, iters, (n - 1.0) / n);
    return Status::Ok();
  }

  Status BroadcastSize(size_t bytes) {
    const bool root = group_.rank() == 0;
    Tensor x = Tensor::Zeros(DType::kFloat32, {static_cast<int64_t>(bytes / 4)});
    constexpr float kPattern = 7.0f;
    if (root) std::fill(x.values<float>().begin(), x.values<float>().end(), kPattern);
    BroadcastOptions o;
    static_cast<Options&>(o) = config_.options;
    const int iters = Iterations(bytes);
    ASSIGN_OR_RETURN(Timing t,
                     Measure(iters, 2, [&] { return Broadcast(group_, x, o); },
                             {.clear =
                                  [&] {
                                    if (!root) std::fill(x.data.begin(), x.data.end(), 0);
                                  },
                              .check = [&] {
                                return ExpectAll(x.values<float>(), kPattern, "broadcast");
                              }}));
    Emit("broadcast", bytes, t, iters, 1.0);
    return Status::Ok();
  }

  // Rank r's indices: fixed by r, so that every rank can work out the sum.
  static std::vector<int64_t> SparseIndices(int r, int64_t rows, int64_t dense_rows) {
    std::mt19937_64 rng(static_cast<uint64_t>(r) + 1);
    std::uniform_int_distribution<int64_t> row(0, dense_rows - 1);
    std::vector<int64_t> out(static_cast<size_t>(rows));
    for (int64_t& i : out) i = row(rng);
    return out;
  }

  Status SparseCase(const std::string& name, const std::function<int64_t(int)>& rows_of) {
    const int n = group_.size(), me = group_.rank();
    constexpr int64_t kDenseRows = 65536, kWidth = 64;
    const Shape dense_shape{kDenseRows, kWidth};
    IndexedSlices mine;
    mine.dense_shape = dense_shape;
    mine.indices = SparseIndices(me, rows_of(me), kDenseRows);
    mine.values = Tensor::Zeros(DType::kFloat32, {rows_of(me), kWidth});
    std::fill(mine.values.values<float>().begin(), mine.values.values<float>().end(), 1.0f);
    // Ones everywhere: the sum's row i is how many times i was sent, exactly.
    std::vector<float> want(static_cast<size_t>(kDenseRows), 0.0f);
    std::vector<int64_t> rows;
    for (int r = 0; r < n; ++r) {
      rows.push_back(rows_of(r));
      for (int64_t i : SparseIndices(r, rows_of(r), kDenseRows)) want[static_cast<size_t>(i)] += 1;
    }
    SparseAllReduceOptions o;
    static_cast<Options&>(o) = config_.options;
    IndexedSlices sum;
    SparsePath path = SparsePath::kAuto;
    auto verify = [&]() -> Status {
      ASSIGN_OR_RETURN(Tensor dense, Densify(sum));
      auto v = dense.values<float>();
      for (int64_t i = 0; i < kDenseRows; ++i) {
        if (v[static_cast<size_t>(i * kWidth)] != want[static_cast<size_t>(i)]) {
          return DataLoss("sparse_all_reduce " + name + ": row " + std::to_string(i) + " is " +
                          std::to_string(v[static_cast<size_t>(i * kWidth)]) + ", expected " +
                          std::to_string(want[static_cast<size_t>(i)]));
        }
      }
      return Status::Ok();
    };
    constexpr int kIters = 20;
    ASSIGN_OR_RETURN(Timing t, Measure(
                                   kIters, 2,
                                   [&]() -> Status {
                                     ASSIGN_OR_RETURN(sum, SparseAllReduce(group_, mine, o, &path));
                                     return Status::Ok();
                                   },
                                   {.check = verify}));
    if (me == 0) {
      Print({{"bench", Name()},
             {"op", "sparse_all_reduce"},
             {"case", name},
             {"ranks", n},
             {"dense_shape", dense_shape},
             {"rows", rows},
             {"path", SparsePathName(path)},
             {"time_us", Round(t.p50 * 1e6, 1)},
             {"p99_us", Round(t.p99 * 1e6, 1)},
             {"iters", kIters},
             {"transport", config_.transport}});
    }
    return Status::Ok();
  }

  Group& group_;
  const Config& config_;
};

int RunRank(std::unique_ptr<Transport> transport, const Config& config) {
  Group group(std::move(transport), "bench");
  Status st = Bench(group, config).Run();
  if (!st.ok()) {
    std::cerr << "rank " << group.rank() << ": " << st.ToString() << std::endl;
    return 1;
  }
  return 0;
}

int RunProcesses(const Config& config) {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<std::string> addresses;
  for (int r = 0; r < config.ranks; ++r) {
    auto listener = TcpListener::Bind("127.0.0.1", 0);
    if (!listener.ok()) {
      std::cerr << listener.status().ToString() << std::endl;
      return 1;
    }
    addresses.push_back((*listener)->address());
    listeners.push_back(std::move(listener).value());
  }
  std::cout.flush();
  std::vector<pid_t> children;
  for (int r = 0; r < config.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      for (int other = 0; other < config.ranks; ++other) {
        if (other != r) listeners[other].reset();
      }
      auto transport = TcpTransport::Connect(std::move(listeners[r]), addresses,
                                             {.rank = r,
                                              .size = config.ranks,
                                              .group_id = "bench",
                                              .connect_timeout = std::chrono::seconds(30),
                                              .spin = config.spin});
      int rc = 1;
      if (transport.ok()) {
        rc = RunRank(std::move(transport).value(), config);
      } else {
        std::cerr << "rank " << r << ": " << transport.status().ToString() << std::endl;
      }
      std::cout.flush();
      ::_exit(rc);
    }
    children.push_back(pid);
  }
  listeners.clear();
  int rc = 0;
  for (pid_t pid : children) {
    int wstatus = 0;
    ::waitpid(pid, &wstatus, 0);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) rc = 1;
  }
  return rc;
}

int RunThreads(const Config& config) {
  auto transports = InProcessTransport::CreateGroup(config.ranks);
  std::vector<int> rcs(config.ranks);
  RunRanks(config.ranks, [&](int r) { rcs[r] = RunRank(std::move(transports[r]), config); });
  return *std::max_element(rcs.begin(), rcs.end());
}

}  // namespace
}  // namespace tessera::collectives

int main(int argc, char** argv) {
  using tessera::collectives::Algorithm;
  tessera::collectives::Config config;
  CLI::App app{
      "Tessera collectives benchmark (JSON lines, as bench/peers/allreduce_torch_gloo.py)"};
  app.add_option("--ranks", config.ranks, "ranks (processes for tcp, threads for inproc)")
      ->check(CLI::Range(1, 64));
  app.add_option("--transport", config.transport)->check(CLI::IsMember({"tcp", "inproc"}));
  app.add_option("--min-bytes", config.min_bytes, "smallest size measured (default: all)");
  app.add_option("--max-bytes", config.max_bytes,
                 "largest all_reduce size (64 MiB like the peers)");
  std::string algorithm = "auto";
  app.add_option("--algorithm", algorithm)
      ->check(CLI::IsMember({"auto", "direct", "recursive_doubling", "ring", "halving_doubling"}));
  app.add_option("--chunk-bytes", config.options.chunk_bytes);
  int64_t spin_us = config.spin.count();
  app.add_option("--spin-us", spin_us, "TcpOptions::spin: polling before blocking");
  app.add_option("--iters", config.iters,
                 "timed ops per size (default: as the peers, 64 MiB / size within 5..200)")
      ->check(CLI::Range(0, 10000000));
  app.add_option("--direct-max-bytes", config.options.direct_max_bytes);
  app.add_option("--large-min-bytes", config.options.large_min_bytes);
  app.add_option("--scatter-min-bytes", config.options.scatter_min_bytes);
  app.add_option("--ops", config.ops, "only these ops (default: every one)")
      ->delimiter(',')
      ->check(CLI::IsMember({"all_reduce", "all_gather", "broadcast", "sparse_all_reduce",
                             "barrier"}));
  CLI11_PARSE(app, argc, argv);
  for (Algorithm a :
       {Algorithm::kAuto, Algorithm::kDirect, Algorithm::kRecursiveDoubling, Algorithm::kRing,
        Algorithm::kHalvingDoubling}) {
    if (tessera::collectives::AlgorithmName(a) == algorithm) config.options.algorithm = a;
  }
  config.options.timeout = std::chrono::seconds(120);
  config.spin = std::chrono::microseconds(spin_us);
  return config.transport == "tcp" ? tessera::collectives::RunProcesses(config)
                                   : tessera::collectives::RunThreads(config);
}
