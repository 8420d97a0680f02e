// The cluster's token stays secret: no program prints it or carries it on its
// command line, tesserad's data dir and catalog are its user's alone, a token
// file or TLS key that others could read is refused, and ?token= is taken only
// by the event stream that needs it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "cluster_fixture.h"
#include "storage/env.h"

namespace tessera::e2e {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

unsigned Mode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

// Runs `program` with `args` (and `env` added) until its log shows `until` or it
// exits; returns the log. The process is killed either way.
std::string RunProgram(const std::string& program, const std::vector<std::string>& args,
                       const std::vector<std::string>& env, const std::string& log,
                       const std::string& until = "listening on") {
  // A log left by an earlier run must not be read as this one's.
  ::unlink(log.c_str());
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<std::string> argv = {std::string(TESSERA_BIN_DIR) + "/" + program};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    ::execv(raw[0], raw.data());
    ::_exit(127);
  }
  int status = 0;
  bool exited = false;
  (void)::tessera::testing::Eventually([&] {
    exited = ::waitpid(pid, &status, WNOHANG) == pid;
    return exited || ReadAll(log).find(until) != std::string::npos;
  });
  if (exited) return ReadAll(log);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return ReadAll(log);
}

TEST(Secrets, NoCommandLineOrLogCarriesTheToken) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  ASSERT_FALSE(c->token().empty());
  std::vector<pid_t> pids = {c->server_pid(), c->worker_pid(0), c->worker_pid(1)};
  for (pid_t pid : pids) {
    const std::string cmdline = ReadAll("/proc/" + std::to_string(pid) + "/cmdline");
    ASSERT_FALSE(cmdline.empty()) << pid;
    EXPECT_EQ(cmdline.find(c->token()), std::string::npos) << "pid " << pid << ": " << cmdline;
  }
  // Saves and collectives ran with it all the same.
  ASSERT_TRUE(c->PutMesh("two", Json::parse(R"([{"name":"data","size":2}])")).ok());
  for (const std::string& log : {c->server_log(), c->worker_log(0), c->worker_log(1)}) {
    const std::string text = ReadAll(log);
    EXPECT_EQ(text.find(c->token()), std::string::npos) << log;
    EXPECT_EQ(text.find("warning: --token"), std::string::npos) << log;
  }
  EXPECT_NE(ReadAll(c->server_log()).find("token: from TESSERA_TOKEN"), std::string::npos);

  // The data dir and the catalog's files are tesserad's user's alone.
  const std::string data = c->dir() + "/data";
  EXPECT_EQ(Mode(data), 0700u);
  EXPECT_EQ(Mode(data + "/catalog.sqlite"), 0600u);
  EXPECT_EQ(Mode(data + "/catalog.sqlite-wal"), 0600u);
}

TEST(Secrets, OnlyTheEventStreamTakesTheTokenInItsQuery) {
  tools::ClusterOptions opts;
  opts.workers = 1;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  http::Client anonymous(c->url(), "", 10);
  const std::string q = "?token=" + c->token();
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"PUT", "/api/v1/kv/secret" + q},
           {"GET", "/api/v1/workers" + q},
           {"GET", "/api/v1/jobs" + q}}) {
    auto r = anonymous.Send(method, path, method == "PUT" ? "x" : "");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 401) << method << " " << path << ": " << r->body;
  }
  // The event stream: its header comes at once, 200, while the body never ends.
  const int port = std::stoi(c->url().substr(c->url().rfind(':') + 1));
  for (const auto& [query, want] : std::vector<std::pair<std::string, std::string>>{
           {q, "HTTP/1.1 200"}, {"?token=wrong", "HTTP/1.1 401"}}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string req = "GET /api/v1/events" + query + " HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    char buf[64] = {};
    ASSERT_GT(::recv(fd, buf, sizeof(buf) - 1, 0), 12);
    EXPECT_EQ(std::string(buf).substr(0, 12), want) << buf;
    ::close(fd);
  }
}

TEST(Secrets, TokenSourcesAreCheckedAndNeverEchoed) {
  const std::string dir = ::testing::TempDir() + "/secrets-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::vector<std::string> listen = {"--listen", "127.0.0.1:0"};
  auto with = [&](std::vector<std::string> more, const std::string& data) {
    std::vector<std::string> args = listen;
    args.insert(args.end(), {"--data-dir", dir + "/" + data});
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  // None given: tesserad makes <data-dir>/token, 0600, and says where, not what.
  std::string log = RunProgram("tesserad", with({}, "fresh"), {}, dir + "/fresh.log");
  ASSERT_NE(log.find("listening on"), std::string::npos) << log;
  const std::string made = ReadAll(dir + "/fresh/token");
  ASSERT_GE(made.size(), 32u);
  EXPECT_EQ(Mode(dir + "/fresh/token"), 0600u);
  EXPECT_NE(log.find("token: from the file " + dir + "/fresh/token"), std::string::npos) << log;
  EXPECT_EQ(log.find(made), std::string::npos) << log;
  // --token works, with a warning that names the risk.
  log = RunProgram("tesserad", with({"--token", "on-the-command-line"}, "flag"), {}, dir + "/flag.log");
  ASSERT_NE(log.find("listening on"), std::string::npos) << log;
  EXPECT_NE(log.find("warning: --token puts the cluster's secret on the command line"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("on-the-command-line"), std::string::npos) << log;
  // A token file others can read is refused, naming it and the fix.
  const std::string file = dir + "/token";
  std::ofstream(file) << "a-secret\n";
  ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
  log = RunProgram("tesserad", with({"--token-file", file}, "open"), {}, dir + "/open.log");
  EXPECT_EQ(log.find("listening on"), std::string::npos) << log;
  EXPECT_NE(log.find("the token file " + file + " has mode 0644"), std::string::npos) << log;
  EXPECT_NE(log.find("chmod 600"), std::string::npos) << log;
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  log = RunProgram("tesserad", with({"--token-file", file}, "file"), {}, dir + "/file.log");
  ASSERT_NE(log.find("listening on"), std::string::npos) << log;
  EXPECT_NE(log.find("token: from --token-file " + file), std::string::npos) << log;
  EXPECT_EQ(log.find("a-secret"), std::string::npos) << log;
  EXPECT_TRUE(storage::DefaultEnv()->DeleteTree(dir).ok());
}

// Fault hooks are known only to the test programs (tests/faults): the shipped worker
// with a hook in its environment runs its tasks undelayed and says nothing of faults,
// while tessera-worker-faults announces each hook it honours and refuses a malformed one.
TEST(FaultHooks, OnlyTheTestProgramsKnowThem) {
  const std::string dir = ::testing::TempDir();
  const std::string hook = "TESSERA_FAULT_TASK_DELAY=write:60000";
  const std::vector<std::string> args = {"--server", "http://127.0.0.1:9", "--name", "hooked"};
  std::string log = RunProgram("tessera-worker-faults", args, {hook}, dir + "/hook-on.log",
                               "fault injection is on");
  EXPECT_NE(log.find("warning: fault injection is on (tessera-worker-faults): " + hook),
            std::string::npos)
      << log;
  log = RunProgram("tessera-worker-faults", args, {"TESSERA_FAULT_TASK_DELAY=write"},
                   dir + "/hook-bad.log", "error:");
  EXPECT_NE(log.find("TESSERA_FAULT_TASK_DELAY='write'"), std::string::npos) << log;

  // Inherited rather than given through worker_env, which would start the test program.
  ASSERT_EQ(::setenv("TESSERA_FAULT_TASK_DELAY", "write:60000", 1), 0);
  tools::ClusterOptions opts;
  opts.workers = 1;
  auto c = StartCluster(opts);
  ::unsetenv("TESSERA_FAULT_TASK_DELAY");
  ASSERT_TRUE(c);
  EXPECT_NE(ReadAll("/proc/" + std::to_string(c->worker_pid(0)) + "/environ").find(hook),
            std::string::npos);
  const Mesh one{"one", {{"data", 1}}, 1};
  ASSERT_TRUE(c->PutMesh(one.name, MeshToJson(one)["axes"]).ok());
  Push(*c, one, MakeGlobal("w", DType::kFloat32, {64, 16}, Layout{{"data", "unsharded"}}, 1));
  // Had the write waited its minute, this wait (30 s) would end first.
  auto j = c->WaitJob(StartSave(*c, one.name, 1), 30000);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["state"], "succeeded") << j->dump();
  EXPECT_EQ(ReadAll(c->worker_log(0)).find("fault injection"), std::string::npos)
      << ReadAll(c->worker_log(0));
}

}  // namespace
}  // namespace tessera::e2e
