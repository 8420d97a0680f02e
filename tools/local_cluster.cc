#include "tools/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "api/clock.h"

namespace tessera::tools {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Reap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// A fault hook is for the test programs that have them; the shipped programs know none.
bool HasFaultHook(const std::vector<std::string>& env) {
  return std::any_of(env.begin(), env.end(),
                     [](const std::string& e) { return e.rfind("TESSERA_FAULT_", 0) == 0; });
}

}  // namespace

std::string SelfDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : p.parent_path().string();
}

Result<ChildProcess> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                           const std::string& log, int64_t timeout_ms) {
  ChildProcess child;
  child.log = log;
  const size_t start = std::filesystem::exists(log) ? std::filesystem::file_size(log) : 0;
  pid_t pid = ::fork();
  if (pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test or demo that started us
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  child.pid = pid;
  static const std::regex listening("listening on (https?://[0-9.]+:[0-9]+)");
  const int64_t deadline = MonoMs() + timeout_ms;
  while (MonoMs() < deadline) {
    std::string text = ReadFile(log).substr(start);
    std::smatch m;
    if (std::regex_search(text, m, listening)) {
      child.url = m[1];
      return child;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return Internal(argv[0] + " exited during start-up; its log " + log + " says: " +
                      text.substr(0, 2000));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Reap(pid);
  return DeadlineExceeded(argv[0] + " did not print its address within " +
                          std::to_string(timeout_ms) + " ms; see " + log);
}

Result<std::unique_ptr<LocalCluster>> LocalCluster::Start(ClusterOptions options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->options_ = options;
  if (options.dir.empty()) {
    char tmpl[] = "/tmp/tessera-cluster-XXXXXX";
    if (!::mkdtemp(tmpl)) return Internal("mkdtemp failed");
    c->dir_ = tmpl;
    c->own_dir_ = true;
  } else {
    c->dir_ = options.dir;
    std::filesystem::create_directories(c->dir_);
  }
  if (c->options_.bin_dir.empty()) c->options_.bin_dir = SelfDir();
  c->token_ = "tessera-local-" + std::to_string(::getpid()) + "-" + std::to_string(MonoMs());
  RETURN_IF_ERROR(c->StartServer(0));
  if (options.standbys > 0) {
    // The first leads before any other starts, so that which one leads is known.
    RETURN_IF_ERROR(c->WaitForLeader(15000).status());
    c->leader_url_.clear();
    for (int i = 0; i < options.standbys; ++i) {
      const std::string name = "s" + std::to_string(i);
      ASSIGN_OR_RETURN(ChildProcess p, Spawn(c->ServerArgv(0, c->dir_ + "/data-" + name),
                                             {"TESSERA_TOKEN=" + c->token_},
                                             c->dir_ + "/tesserad-" + name + ".log", 15000));
      c->standbys_.push_back(std::move(p));
    }
  }
  for (int i = 0; i < options.workers; ++i) {
    c->workers_.emplace_back();
    RETURN_IF_ERROR(c->StartWorker(i));
  }
  RETURN_IF_ERROR(c->WaitAlive(options.workers, 20000));
  return c;
}

LocalCluster::~LocalCluster() {
  // SIGTERM first so workers unlink their shared-memory mappings; then make sure.
  for (auto& w : workers_) {
    if (w.pid > 0) ::kill(w.pid, SIGTERM);
  }
  const int64_t deadline = MonoMs() + 3000;
  for (auto& w : workers_) {
    while (w.pid > 0 && MonoMs() < deadline) {
      if (::waitpid(w.pid, nullptr, WNOHANG) == w.pid) {
        w.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Reap(w.pid);
  }
  Reap(server_.pid);
  for (auto& s : standbys_) Reap(s.pid);
  if (own_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string LocalCluster::servers() const {
  std::string out = server_.url;
  for (const auto& s : standbys_) out += "," + s.url;
  return out;
}

Result<std::string> LocalCluster::WaitForLeader(int64_t timeout_ms, const std::string& not_url) {
  std::vector<std::string> urls = {server_.url};
  for (const auto& s : standbys_) urls.push_back(s.url);
  const int64_t deadline = MonoMs() + timeout_ms;
  while (MonoMs() < deadline) {
    for (const std::string& u : urls) {
      if (u == not_url) continue;
      auto h = http::Client(u, token_, 2).Call("GET", "/healthz");
      if (h.ok() && h->value("role", "") == "leader") {
        leader_url_ = u;
        return u;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return DeadlineExceeded("no tesserad of " + servers() + " leads after " + std::to_string(timeout_ms) + " ms");
}

std::vector<std::string> LocalCluster::ServerArgv(int port, const std::string& data_dir) const {
  std::vector<std::string> argv = {
      options_.bin_dir + "/tesserad", "--listen", "127.0.0.1:" + std::to_string(port),
      "--data-dir", data_dir,
      "--heartbeat-ms", std::to_string(options_.heartbeat_ms),
      "--lease-ms", std::to_string(options_.lease_ms),
      "--threads", std::to_string(options_.server_threads)};
  argv.insert(argv.end(), {"--checkpoint-root", checkpoint_root()});  // one, whatever the data dir
  argv.insert(argv.end(), options_.server_args.begin(), options_.server_args.end());
  return argv;
}

Status LocalCluster::StartServer(int port) {
  std::vector<std::string> argv = ServerArgv(port, dir_ + "/data");
  std::vector<std::string> env = options_.server_env;
  if (HasFaultHook(env)) argv[0] += "-faults";
  // The token goes in the environment, which only this user can read in /proc.
  env.push_back("TESSERA_TOKEN=" + token_);
  ASSIGN_OR_RETURN(server_, Spawn(argv, env, dir_ + "/tesserad.log", 15000));
  return Status::Ok();
}

Status LocalCluster::StartWorker(int i) {
  auto env = options_.worker_env.count(i) ? options_.worker_env.at(i) : std::vector<std::string>{};
  std::vector<std::string> argv = {options_.bin_dir + (HasFaultHook(env) ? "/tessera-worker-faults"
                                                              : "/tessera-worker"),
                                   "--server", servers(),
                                   "--name", options_.worker_name_prefix + std::to_string(i),
                                   "--devices", std::to_string(options_.devices_per_worker),
                                   "--copy-threads", std::to_string(options_.copy_threads)};
  if (auto extra = options_.worker_args.find(i); extra != options_.worker_args.end()) {
    argv.insert(argv.end(), extra->second.begin(), extra->second.end());
  }
  env.push_back("TESSERA_TOKEN=" + token_);
  ASSIGN_OR_RETURN(workers_[i],
                   Spawn(argv, env, dir_ + "/worker-" + std::to_string(i) + ".log", 15000));
  return Status::Ok();
}

Status LocalCluster::WaitAlive(int n, int64_t timeout_ms) {
  const int64_t deadline = MonoMs() + timeout_ms;
  Status last;
  while (MonoMs() < deadline) {
    auto r = Call("GET", "/api/v1/cluster");
    if (r.ok() && (*r)["workers"].value("alive", 0) >= n) return Status::Ok();
    if (!r.ok()) last = r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return DeadlineExceeded("fewer than " + std::to_string(n) + " workers alive after " +
                          std::to_string(timeout_ms) + " ms " + last.ToString());
}

Result<Json> LocalCluster::Call(const std::string& method, const std::string& path,
                                const Json& body) {
  http::Client client = Client();
  return client.Call(method, path, body);
}

Result<Json> LocalCluster::PutMesh(const std::string& name, const Json& axes,
                                   int devices_per_worker, int first_worker) {
  int64_t devices = 1;
  for (const auto& a : axes) devices *= a.value("size", 1);
  Json workers = Json::array();
  for (int64_t r = 0; r < devices / devices_per_worker; ++r) {
    workers.push_back(worker_id(first_worker + static_cast<int>(r)));
  }
  return Call("PUT", "/api/v1/meshes/" + name,
              {{"axes", axes}, {"devices_per_worker", devices_per_worker}, {"workers", workers}});
}

Result<Json> LocalCluster::WaitJob(const std::string& job, int64_t timeout_ms) {
  const int64_t deadline = MonoMs() + timeout_ms;
  while (true) {
    ASSIGN_OR_RETURN(Json j, Call("GET", "/api/v1/jobs/" + job + "?wait_ms=5000"));
    const std::string state = j.value("state", "");
    if (state == "succeeded" || state == "failed" || state == "cancelled") return j;
    if (MonoMs() > deadline) return DeadlineExceeded("job " + job + " still " + state);
  }
}

void LocalCluster::KillWorker(int i) {
  Reap(workers_.at(i).pid);
  workers_.at(i).pid = -1;
}

void LocalCluster::KillServer() {
  Reap(server_.pid);
  server_.pid = -1;
}

Status LocalCluster::RestartServer() {
  int port = std::atoi(server_.url.substr(server_.url.rfind(':') + 1).c_str());
  // The old port may linger briefly in TIME_WAIT; retry.
  Status st;
  for (int attempt = 0; attempt < 50; ++attempt) {
    st = StartServer(port);
    if (st.ok()) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return st;
}

}  // namespace tessera::tools
