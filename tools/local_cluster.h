// A local cluster of real processes: one tesserad and N tessera-workers on
// 127.0.0.1, each on a port of its own choosing (read from its first lines of
// output). Used by `tessera demo`, the end-to-end tests and the benchmarks.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "http/client.h"
#include "http/local_credential.h"
#include "api/json_codec.h"
#include "api/status.h"

namespace tessera::tools {

struct ClusterOptions {
  std::string bin_dir;         // holds tesserad and tessera-worker (and their -faults twins)
  std::string dir;             // data dir, checkpoint root and logs; empty: a new temp dir
  int workers = 4;
  int devices_per_worker = 1;
  int64_t heartbeat_ms = 200;
  int64_t lease_ms = 1500;
  int server_threads = 256;  // above the number of workers: each holds a long-poll
  int copy_threads = 1;      // per worker; several workers share this machine's cores
  // Extra environment for workers, by worker index. A TESSERA_FAULT_* hook among it
  // starts that worker as tessera-worker-faults (tests/faults/fault_hooks.h).
  std::map<int, std::vector<std::string>> worker_env;
  // Extra flags for workers, by worker index.
  std::map<int, std::vector<std::string>> worker_args;
  // Elsewhere for the checkpoints (a directory, or s3://BUCKET/PREFIX), and more
  // tesserad flags (e.g. --s3-endpoint URL).
  std::string checkpoint_root;
  std::vector<std::string> server_args;
  // Extra environment for the first tesserad; a TESSERA_FAULT_* hook among it starts
  // tesserad-faults.
  std::vector<std::string> server_env;
  std::string worker_name_prefix = "worker-";  // worker i is named <prefix><i>
  // More tesserads on the same root (server_args must then hold --ha etcd://...): each
  // with a data dir of its own, started once the first leads; workers get every URL.
  int standbys = 0;
};

struct ChildProcess {
  pid_t pid = -1;
  std::string log;  // stdout + stderr
  std::string url;  // "http://127.0.0.1:PORT" from its "listening on" line
};

class LocalCluster {
 public:
  // Starts tesserad and the workers and waits until every worker is alive.
  static Result<std::unique_ptr<LocalCluster>> Start(ClusterOptions options);
  // Kills every process; removes the temp dir if it created one.
  ~LocalCluster();

  // The tesserad calls go to: the first one, or the leader WaitForLeader found.
  std::string url() const { return leader_url_.empty() ? server_.url : leader_url_; }
  // Every tesserad's URL, "URL0,URL1,..." (the first one's first), as workers get them.
  std::string servers() const;
  // The i-th standby started with the cluster (ClusterOptions::standbys).
  const ChildProcess& standby(int i) const { return standbys_.at(i); }
  // Polls every tesserad's /healthz until one other than `not_url` says it leads;
  // from then on calls go to it. Its URL.
  Result<std::string> WaitForLeader(int64_t timeout_ms, const std::string& not_url = "");
  const std::string& token() const { return token_; }
  const std::string& dir() const { return dir_; }
  std::string checkpoint_root() const {
    return options_.checkpoint_root.empty() ? dir_ + "/data/checkpoints" : options_.checkpoint_root;
  }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // Worker i's id ("w-worker-<i>") and local API URL.
  std::string worker_id(int i) const {
    return "w-" + options_.worker_name_prefix + std::to_string(i);
  }
  const std::string& worker_url(int i) const { return workers_.at(i).url; }
  pid_t worker_pid(int i) const { return workers_.at(i).pid; }
  pid_t server_pid() const { return server_.pid; }
  const std::string& server_log() const { return server_.log; }
  const std::string& worker_log(int i) const { return workers_.at(i).log; }

  http::Client Client(int timeout_s = 60) const { return http::Client(url(), token_, timeout_s); }
  // A client of worker i's local API, with the worker's local credential.
  http::Client WorkerClient(int i, int timeout_s = 60) const {
    return http::Client(worker_url(i), http::FindLocalCredential(worker_url(i)), timeout_s);
  }
  // REST call to tesserad.
  Result<Json> Call(const std::string& method, const std::string& path, const Json& body = nullptr);
  // Registers a mesh whose ranks are workers first_worker, first_worker+1, ...
  Result<Json> PutMesh(const std::string& name, const Json& axes, int devices_per_worker = 1,
                       int first_worker = 0);
  // Waits for a job to end; returns its final record.
  Result<Json> WaitJob(const std::string& job, int64_t timeout_ms = 120000);

  // kill -9.
  void KillWorker(int i);
  // Starts worker i again under its name, after KillWorker (its RAM empty).
  Status RestartWorker(int i) { return StartWorker(i); }
  void KillServer();
  // Starts tesserad again on the same port and data dir.
  Status RestartServer();
  // Waits until n workers are alive.
  Status WaitAlive(int n, int64_t timeout_ms);

 private:
  LocalCluster() = default;
  Status StartServer(int port);
  // The tesserad command line; `data_dir` its own.
  std::vector<std::string> ServerArgv(int port, const std::string& data_dir) const;
  Status StartWorker(int i);

  ClusterOptions options_;
  std::string dir_;
  bool own_dir_ = false;
  std::string token_;
  ChildProcess server_;
  std::vector<ChildProcess> standbys_;
  std::string leader_url_;  // set by WaitForLeader
  std::vector<ChildProcess> workers_;
};

// Spawns `argv` with stdout+stderr appended to `log` and `env` added to the
// environment, then waits up to `timeout_ms` for a "listening on http://..." line.
Result<ChildProcess> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                           const std::string& log, int64_t timeout_ms);

// The directory holding the running executable.
std::string SelfDir();

}  // namespace tessera::tools
