// tessera-worker: one per host. Serves the trainer's local API, holds its
// tensors, and executes save / restore tasks from tesserad.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "http/bearer_token.h"
#include "http/local_credential.h"
#include "http/server.h"
#include "http/tls.h"
#include "storage/env.h"
#include "storage/testing/fault_env.h"
#include "storage/s3/client.h"
#include "storage/s3/s3_env.h"
#include "worker/agent.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "worker/local_routes.h"
#include "worker/mesh_collectives.h"

namespace {

// SIGINT / SIGTERM only write a byte here (async-signal-safe); a thread of
// its own reads it and stops the server, which takes locks and joins threads.
int g_stop_pipe[2] = {-1, -1};

void OnSignal(int) {
  const char c = 1;
  (void)!::write(g_stop_pipe[1], &c, 1);
}

bool SplitHostPort(const std::string& s, std::string* host, int* port) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  *host = s.substr(0, colon);
  *port = std::atoi(s.c_str() + colon + 1);
  return *port >= 0 && *port <= 65535;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-worker: Tessera worker agent"};
  std::string server = "http://127.0.0.1:7070", token, tls_ca, local_credential, name, local = "127.0.0.1:0",
              data = "127.0.0.1:0", shm_dir = "/dev/shm", advertise, s3_endpoint;
  int devices = 1, io_threads = 2, copy_threads = 2;
  tessera::worker::AgentOptions aopts;
  app.add_option("--server", server, "tesserad address");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "read the cluster's bearer token from this file (mode 0600); else TESSERA_TOKEN");
  app.add_option("--token", token,
                 "the bearer token itself: every local user can read it in /proc (warned); "
                 "prefer --token-file or TESSERA_TOKEN");
  app.add_option("--local-credential", local_credential,
                 "file the local API's credential is written to, mode 0600 (default /tmp/tessera-<uid>/local-<port>.key, where clients on this host look)");
  app.add_option("--tls-ca", tls_ca, "PEM file of the CA that signed tesserad's certificate, for an https:// --server (else TESSERA_TLS_CA, else the system's CAs)")
      ->check(CLI::ExistingFile);
  app.add_option("--devices", devices, "devices this worker owns")->check(CLI::Range(1, 4096));
  app.add_option("--local-listen", local, "local API host:port (loopback only)");
  app.add_option("--data-listen", data, "data-plane host:port for collectives");
  app.add_option("--host", advertise,
                 "address other workers reach this one at (default: the --data-listen host, "
                 "or 127.0.0.1 when that is 0.0.0.0)");
  app.add_option("--name", name, "stable worker name (id w-<name>)");
  app.add_option("--shm-dir", shm_dir, "where tensor mappings are created");
  app.add_option("--s3-endpoint", s3_endpoint,
                 "the S3 server as this host reaches it (else TESSERA_S3_ENDPOINT, else what "
                 "tesserad was given); credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY");
  app.add_option("--io-threads", io_threads, "compression threads")->check(CLI::Range(1, 64));
  app.add_option("--copy-threads", copy_threads,
                 "threads copying a snapshot (the trainer's stall); with several workers on "
                 "one host, cores / workers")
      ->check(CLI::Range(1, 64));
  app.add_option("--max-pending-saves", aopts.max_pending_saves,
                 "in-loop saves whose snapshot waits for its job (tesserad away or slow) at "
                 "once; past it /v1/save answers 503 naming the limit")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  app.add_option("--max-pending-save-bytes", aopts.max_pending_save_bytes,
                 "the same, in bytes of snapshots (0: no byte limit)")
      ->capture_default_str();
  bool unsafe_faults = false;
  app.add_flag("--unsafe-fault-injection", unsafe_faults,
               "honour the TESSERA_FAULT_* test hooks (delayed tasks, a disk that fills up, failing "
               "S3 requests); never in production");
  app.set_version_flag("--version", TESSERA_VERSION);
  CLI11_PARSE(app, argc, argv);
  if (!s3_endpoint.empty()) tessera::storage::SetDefaultS3Endpoint(s3_endpoint);
  {
    auto chosen = tessera::http::ChooseToken(token, token_file, "tessera-worker");
    if (!chosen.ok()) {
      std::fprintf(stderr, "error: %s\n", chosen.status().ToString().c_str());
      return 2;
    }
    token = chosen->token;
  }
  std::string local_host, data_host;
  int local_port = 0, data_port = 0;
  if (!SplitHostPort(local, &local_host, &local_port) || !SplitHostPort(data, &data_host, &data_port)) {
    std::fprintf(stderr, "error: --local-listen and --data-listen take host:port\n");
    return 2;
  }
  if (local_host != "127.0.0.1" && local_host != "localhost") {
    std::fprintf(stderr, "error: the local API binds loopback only (127.0.0.1)\n");
    return 2;
  }
  // The data port: every collectives group this worker joins is reached through it.
  auto listener = tessera::collectives::TcpListener::Bind(data_host, data_port);
  if (!listener.ok()) {
    std::fprintf(stderr, "error: data plane: %s\n", listener.status().ToString().c_str());
    return 1;
  }
  const int bound_data = (*listener)->port();
  // Only peers that prove they know the cluster's token join a group through it.
  auto data_key = tessera::collectives::DeriveDataPortKey(token);
  if (!data_key.ok()) {
    std::fprintf(stderr, "error: data plane: %s\n", data_key.status().ToString().c_str());
    return 1;
  }
  if (token.empty()) {
    std::fprintf(stderr,
                 "warning: no token (--token-file or TESSERA_TOKEN): the data port admits any "
                 "peer that speaks its protocol\n");
  }
  auto acceptor = tessera::collectives::TcpAcceptor::Start(std::move(listener).value(), *data_key);
  if (!acceptor.ok()) {
    std::fprintf(stderr, "error: data plane: %s\n", acceptor.status().ToString().c_str());
    return 1;
  }
  if (advertise.empty()) advertise = data_host == "0.0.0.0" ? "127.0.0.1" : data_host;

  // Fault injection (tests), only with --unsafe-fault-injection, never silently:
  // TESSERA_FAULT_TASK_DELAY=kind:ms[,kind:ms] delays tasks;
  // TESSERA_FAULT_DISK_FULL_AFTER=bytes makes writes fail with ENOSPC after that many bytes;
  // TESSERA_FAULT_S3=text fails the S3 requests that contain it (storage/s3/client.h).
  tessera::storage::s3::AllowFaultInjection(unsafe_faults);
  for (const char* hook : {"TESSERA_FAULT_TASK_DELAY", "TESSERA_FAULT_DISK_FULL_AFTER"}) {
    if (std::getenv(hook) != nullptr && !unsafe_faults) {
      std::fprintf(stderr, "warning: %s is ignored: fault injection needs --unsafe-fault-injection\n",
                   hook);
    }
  }
  if (unsafe_faults) std::fprintf(stderr, "warning: fault injection is on (--unsafe-fault-injection)\n");
  std::map<std::string, int64_t> delays;
  if (const char* spec = unsafe_faults ? std::getenv("TESSERA_FAULT_TASK_DELAY") : nullptr) {
    std::string s = spec;
    for (size_t pos = 0; pos < s.size();) {
      size_t comma = s.find(',', pos), colon = s.find(':', pos);
      if (colon == std::string::npos || (comma != std::string::npos && colon > comma)) break;
      delays[s.substr(pos, colon - pos)] = std::atoll(s.c_str() + colon + 1);
      pos = comma == std::string::npos ? s.size() : comma + 1;
    }
  }
  tessera::storage::Env* env = tessera::storage::DefaultEnv();
  std::unique_ptr<tessera::storage::FaultEnv> fault_env;
  if (const char* limit = unsafe_faults ? std::getenv("TESSERA_FAULT_DISK_FULL_AFTER") : nullptr) {
    fault_env = std::make_unique<tessera::storage::FaultEnv>(env);
    fault_env->FailAfterBytes(std::strtoull(limit, nullptr, 10));
    env = fault_env.get();
    std::fprintf(stderr, "fault injection: disk full after %s bytes\n", limit);
  }

  aopts.task_delay_ms = delays;
  if (!tls_ca.empty()) tessera::http::SetDefaultCaFile(tls_ca);
  aopts.server = server;
  aopts.token = token;
  aopts.name = name;
  aopts.devices = devices;
  aopts.data_port = bound_data;
  aopts.host = advertise;
  aopts.io_threads = io_threads;
  tessera::worker::Agent agent(aopts, env);
  // Each mapped shard keeps its file open (snapshots read it with pread): a model
  // with thousands of tensors needs more than the usual soft limit of 1024.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);
  }
  tessera::worker::TensorStoreOptions sopts;
  sopts.shm_dir = shm_dir;
  sopts.copy_threads = copy_threads;
  if (int n = tessera::worker::RemoveOrphanedShmFiles(shm_dir); n > 0) {
    std::fprintf(stderr, "removed %d mapping files left by workers that died\n", n);
  }
  tessera::worker::TensorStore store(agent.Resolver(), sopts);
  agent.SetStore(&store);
  tessera::worker::MeshCollectives collectives(acceptor->get(), agent.DataAddresses());
  agent.SetCollectives(&collectives);

  auto router = std::make_shared<tessera::http::Router>();
  tessera::worker::AddLocalRoutes(router.get(), &store, &agent, &collectives);
  tessera::http::ServerOptions hopts;
  hopts.host = "127.0.0.1";
  hopts.port = local_port;
  // A request in progress holds a thread, and saves, restores and collectives
  // wait in theirs: room for several trainers' threads.
  hopts.threads = 64;
  hopts.max_body_bytes = size_t{64} << 30;  // tensor shards
  hopts.read_timeout_s = 300;
  hopts.write_timeout_s = 300;
  hopts.body_timeout_s = 3600;  // a shard of many GiB
  // Other users of this host reach the loopback port too: every route but
  // /healthz needs the credential that only this user can read.
  auto credential = tessera::http::NewLocalCredential();
  if (!credential.ok()) {
    std::fprintf(stderr, "error: %s\n", credential.status().ToString().c_str());
    return 1;
  }
  hopts.token = *credential;
  tessera::http::Server http(router, hopts);
  auto bound = http.Bind();
  if (!bound.ok()) {
    std::fprintf(stderr, "error: %s\n", bound.status().ToString().c_str());
    return 1;
  }
  if (local_credential.empty()) local_credential = tessera::http::DefaultLocalCredentialPath(*bound);
  http.set_token_hint("the token is this worker's local credential, in " + local_credential +
                      " (readable by the worker's user only)");
  if (auto st = tessera::http::WriteLocalCredential(local_credential, *credential); !st.ok()) {
    std::fprintf(stderr, "error: local API credential: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("listening on http://127.0.0.1:%d\n", *bound);
  std::printf("local credential: %s\n", local_credential.c_str());
  std::printf("data plane on %s:%d\n", data_host.c_str(), bound_data);
  std::fflush(stdout);
  // Register with the real local port, now that it is known.
  agent.SetLocalPort(*bound);
  if (auto st = agent.Register(30000); !st.ok()) {
    std::fprintf(stderr, "error: cannot register with %s: %s\n", server.c_str(),
                 st.ToString().c_str());
    return 1;
  }
  std::printf("registered as %s with %s\n", agent.id().c_str(), server.c_str());
  std::fflush(stdout);
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "error: pipe: %s\n", std::strerror(errno));
    return 1;
  }
  std::thread stopper([&http] {
    char c;
    while (::read(g_stop_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    http.Stop();
  });
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
  agent.Start();
  http.Run();
  OnSignal(0);  // wakes the stopper when Run ended by itself
  stopper.join();
  ::unlink(local_credential.c_str());
  agent.Stop();
  return 0;
}
