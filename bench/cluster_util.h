// What the cluster benchmarks share: timing, dying with the culprit, waiting on a job,
// and in-process agents (real registration, task delivery, snapshots, shard writes and
// joins, without a process per rank).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "storage/env.h"
#include "tools/local_cluster.h"
#include "worker/agent.h"
#include "worker/tensor_store.h"

namespace tessera::bench {

using Clock = std::chrono::steady_clock;

inline double Secs(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] inline void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "cluster_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.status());
  return std::move(r).value();
}

inline Json WaitJob(tools::LocalCluster& c, const std::string& job) {
  Json j = Check(c.WaitJob(job, 600000), "wait job");
  if (j["state"] != "succeeded") Die("job " + job, Internal(j["error"].dump()));
  return j;
}

// In-process agents on one tesserad, each writing through `env`.
struct InProcessAgents {
  std::vector<std::unique_ptr<worker::Agent>> agents;
  std::vector<std::unique_ptr<worker::TensorStore>> stores;
  Json ids = Json::array();

  InProcessAgents(tools::LocalCluster& c, int ranks, const std::string& prefix,
                  worker::TensorStoreOptions store_options = {},
                  storage::Env* env = storage::DefaultEnv()) {
    for (int r = 0; r < ranks; ++r) {
      worker::AgentOptions o;
      o.server = c.url();
      o.token = c.token();
      o.name = prefix + std::to_string(r);
      o.local_port = 1;
      o.io_threads = 1;
      auto a = std::make_unique<worker::Agent>(o, env);
      auto s = std::make_unique<worker::TensorStore>(a->Resolver(), store_options);
      a->SetStore(s.get());
      if (auto st = a->Register(5000); !st.ok()) Die("register rank", st);
      a->Start();
      ids.push_back(a->id());
      agents.push_back(std::move(a));
      stores.push_back(std::move(s));
    }
  }
  // Each Stop waits out a long-poll: stop them together.
  void Stop() {
    std::vector<std::thread> stoppers;
    for (auto& a : agents) stoppers.emplace_back([&a] { a->Stop(); });
    for (auto& t : stoppers) t.join();
  }
};

}  // namespace tessera::bench
