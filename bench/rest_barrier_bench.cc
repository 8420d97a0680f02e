// REST barrier latency: tesserad's POST /api/v1/barriers/{name}, 4 client threads.
//
// Starts a tesserad of its own (no workers, a temp data dir, the binary next to
// this one), then first asks whether the route exists: one rank-0 call with
// world 1. Without it (404, 405 or any other answer but 2xx) it prints
//   {"bench":"rest_barrier","available":false,"status":404,"reason":"..."}
// and exits 0, so the report can say "not measured yet". With it, `ranks`
// threads, each with its own HTTP client (Authorization: Bearer <token>), call
//   POST /api/v1/barriers/bench  {"rank": r, "world": ranks}
// back to back: `warmup` rounds, then `iters` timed ones. As in the collectives
// benchmarks, each round's time is the slowest rank's and the median (p50) and
// p99 (nearest rank) are reported, in µs:
//   {"bench":"rest_barrier","available":true,"op":"barrier","ranks":4,
//    "time_us":..,"p50_us":..,"p99_us":..,"max_us":..,"iters":200}
//
//   tessera_bench_rest_barrier [--ranks 4] [--iters 200] [--warmup 10]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "http/client.h"
#include "tools/local_cluster.h"
#include "bench/stats.h"

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

using tessera::bench::Median;
using tessera::bench::Percentile;
using tessera::bench::EmitLine;

double Round1(double v) { return std::round(v * 10) / 10; }

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4, iters = 200, warmup = 10;
  std::string name = "bench";
  CLI::App app{"tesserad REST barrier latency (JSON lines)"};
  app.add_option("--ranks", ranks, "client threads, one per rank")->check(CLI::Range(1, 64));
  app.add_option("--iters", iters, "timed barriers")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "untimed barriers first")->check(CLI::Range(0, 1000));
  CLI11_PARSE(app, argc, argv);

  tools::ClusterOptions opts;
  opts.bin_dir = tools::SelfDir();
  opts.workers = 0;
  auto cluster = tools::LocalCluster::Start(opts);
  if (!cluster.ok()) {
    std::fprintf(stderr, "rest_barrier_bench: start tesserad: %s\n",
                 cluster.status().ToString().c_str());
    return 1;
  }
  const std::string url = (*cluster)->url(), token = (*cluster)->token();
  const std::string path = "/api/v1/barriers/" + name;

  {  // Does this tesserad have the route? A one-rank barrier returns at once.
    http::Client client(url, token, 10);
    auto r = client.Send("POST", "/api/v1/barriers/bench-probe",
                         Json{{"rank", 0}, {"world", 1}}.dump());
    if (!r.ok()) {
      std::fprintf(stderr, "rest_barrier_bench: probe: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (r->status / 100 != 2) {
      EmitLine({{"bench", "rest_barrier"},
            {"available", false},
            {"status", r->status},
            {"reason", "POST /api/v1/barriers/{name} answered HTTP " + std::to_string(r->status) +
                           ": " + r->body.substr(0, 200)}});
      return 0;
    }
  }

  // times[r][i]: rank r's i-th timed barrier, seconds; failures are fatal.
  std::vector<std::vector<double>> times(ranks, std::vector<double>(iters));
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      http::Client client(url, token, 60);
      const std::string body = Json{{"rank", r}, {"world", ranks}}.dump();
      for (int i = 0; i < warmup + iters; ++i) {
        const auto t0 = Clock::now();
        auto res = client.Send("POST", path, body);
        const double took = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!res.ok() || res->status / 100 != 2) {
          errors[r] = res.ok() ? "HTTP " + std::to_string(res->status) + ": " + res->body
                               : res.status().ToString();
          return;  // the other ranks then time out (60 s) and fail too
        }
        if (i >= warmup) times[r][i - warmup] = took;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "rest_barrier_bench: rank %d: %s\n", r, errors[r].c_str());
      return 1;
    }
  }
  std::vector<double> slowest(iters);
  for (int i = 0; i < iters; ++i) {
    for (int r = 0; r < ranks; ++r) slowest[i] = std::max(slowest[i], times[r][i]);
  }
  const double p50 = Median(slowest);
  EmitLine({{"bench", "rest_barrier"},
        {"available", true},
        {"op", "barrier"},
        {"ranks", ranks},
        {"time_us", Round1(p50 * 1e6)},
        {"p50_us", Round1(p50 * 1e6)},
        {"p99_us", Round1(Percentile(slowest, 0.99) * 1e6)},
        {"max_us", Round1(*std::max_element(slowest.begin(), slowest.end()) * 1e6)},
        {"iters", iters}});
  return 0;
}
