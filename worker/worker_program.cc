// tessera-worker's program: one per host. Serves the trainer's local API, holds its
// tensors, and executes save / restore tasks from tesserad.
#include "worker/worker_program.h"

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "http/bearer_token.h"
#include "http/local_credential.h"
#include "http/server.h"
#include "http/server_list.h"
#include "http/tls.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "storage/env.h"
#include "storage/s3/s3_env.h"
#include "storage/s3/transport.h"
#include "worker/agent.h"
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

// The command line.
struct Flags {
  std::string server = "http://127.0.0.1:7070", token, token_file, tls_ca, local_credential, name;
  std::string local = "127.0.0.1:0", data = "127.0.0.1:0", shm_dir = "/dev/shm", advertise;
  std::string s3_endpoint;
  int devices = 1, io_threads = 2, copy_threads = 2;
  size_t memory_full_mesh_max = tessera::worker::MemoryChannel::kDefaultFullMeshMax;
  tessera::worker::AgentOptions agent;
};

void AddFlags(CLI::App& app, Flags* f) {
  app.add_option("--server", f->server,
                 "tesserad's URL, or the URLs of several that share a root (URL1,URL2: calls follow "
                 "the one that leads; docs/ha.md); else TESSERA_SERVER")
      ->envname("TESSERA_SERVER");
  app.add_option("--token-file", f->token_file,
                 "read the cluster's bearer token from this file (mode 0600); else TESSERA_TOKEN");
  app.add_option("--token", f->token,
                 "the bearer token itself: every local user can read it in /proc (warned); "
                 "prefer --token-file or TESSERA_TOKEN");
  app.add_option("--local-credential", f->local_credential,
                 "file the local API's credential is written to, mode 0600 (default /tmp/tessera-<uid>/local-<port>.key, where clients on this host look)");
  app.add_option("--tls-ca", f->tls_ca, "PEM file of the CA that signed tesserad's certificate, for an https:// --server (else TESSERA_TLS_CA, else the system's CAs)")
      ->check(CLI::ExistingFile);
  app.add_option("--devices", f->devices, "devices this worker owns")->check(CLI::Range(1, 4096));
  app.add_option("--local-listen", f->local, "local API host:port (loopback only)");
  app.add_option("--data-listen", f->data, "data-plane host:port for collectives");
  app.add_option("--host", f->advertise,
                 "address other workers reach this one at (default: the --data-listen host, "
                 "or 127.0.0.1 when that is 0.0.0.0)");
  app.add_option("--name", f->name, "stable worker name (id w-<name>)");
  app.add_option("--shm-dir", f->shm_dir, "where tensor mappings are created");
  app.add_option("--s3-endpoint", f->s3_endpoint,
                 "the S3 server as this host reaches it (else TESSERA_S3_ENDPOINT, else what "
                 "tesserad was given); credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY");
  app.add_option("--io-threads", f->io_threads, "compression threads")->check(CLI::Range(1, 64));
  app.add_option("--copy-threads", f->copy_threads,
                 "threads copying a snapshot (the trainer's stall); with several workers on "
                 "one host, cores / workers")
      ->check(CLI::Range(1, 64));
  app.add_option("--memory-full-mesh-max", f->memory_full_mesh_max,
                 "meshes of up to this many workers connect every pair for the memory tier; "
                 "larger ones connect the pairs an exchange uses (docs/memory-tier.md)")
      ->envname("TESSERA_MEMORY_FULL_MESH_MAX")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-pending-saves", f->agent.max_pending_saves,
                 "in-loop saves whose snapshot waits for its job (tesserad away or slow) at "
                 "once; past it /v1/save answers 503 naming the limit")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  app.add_option("--max-pending-save-bytes", f->agent.max_pending_save_bytes,
                 "the same, in bytes of snapshots (0: no byte limit)")
      ->capture_default_str();
  app.set_version_flag("--version", TESSERA_VERSION);
}

// The data port: every collectives group this worker joins is reached through it,
// and only peers that prove they know the cluster's token join a group through it.
tessera::Result<std::unique_ptr<tessera::collectives::TcpAcceptor>> StartDataPlane(
    const std::string& host, int port, const std::string& token) {
  ASSIGN_OR_RETURN(auto listener, tessera::collectives::TcpListener::Bind(host, port));
  ASSIGN_OR_RETURN(auto data_key, tessera::collectives::DeriveDataPortKey(token));
  if (token.empty()) {
    std::fprintf(stderr,
                 "warning: no token (--token-file or TESSERA_TOKEN): the data port admits any "
                 "peer that speaks its protocol\n");
  }
  return tessera::collectives::TcpAcceptor::Start(std::move(listener), data_key);
}

// The local API's server options: loopback only, behind the credential that only this
// user can read (other users of the host reach the loopback port too).
tessera::http::ServerOptions LocalApiOptions(int port, const std::string& credential) {
  tessera::http::ServerOptions hopts;
  hopts.host = "127.0.0.1";
  hopts.port = port;
  // A request in progress holds a thread, and saves, restores and collectives
  // wait in theirs: room for several trainers' threads.
  hopts.threads = 64;
  hopts.max_body_bytes = size_t{64} << 30;  // tensor shards
  hopts.read_timeout_s = 300;
  hopts.write_timeout_s = 300;
  hopts.body_timeout_s = 3600;  // a shard of many GiB
  hopts.token = credential;
  return hopts;
}

// Each mapped shard keeps its file open (snapshots read it with pread): a model
// with thousands of tensors needs more than the usual soft limit of 1024.
void RaiseOpenFileLimit() {
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);
  }
}

int Fail(const std::string& what, const tessera::Status& st) {
  std::fprintf(stderr, "error: %s%s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

// Runs the local API until SIGINT or SIGTERM.
void ServeUntilSignalled(tessera::http::Server& http, tessera::worker::Agent& agent) {
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
}

}  // namespace

namespace tessera::worker {

int RunWorker(int argc, char** argv, const WorkerSeams& seams) {
  // Buffers of a MiB and more (the memory tier's chunks, collectives' messages) are
  // mappings of their own, given back when freed: with glibc's sliding threshold they
  // would stay in the heap once freed, and a worker's RSS would keep its largest
  // exchange (docs/memory-tier.md, "What it costs in RAM").
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  if (seams.s3_transport) tessera::storage::s3::SetDefaultTransport(seams.s3_transport);
  CLI::App app{"tessera-worker: Tessera worker agent"};
  Flags f;
  AddFlags(app, &f);
  CLI11_PARSE(app, argc, argv);
  if (!f.s3_endpoint.empty()) tessera::storage::SetDefaultS3Endpoint(f.s3_endpoint);
  auto chosen = tessera::http::ChooseToken(f.token, f.token_file, "tessera-worker");
  if (!chosen.ok()) {
    std::fprintf(stderr, "error: %s\n", chosen.status().ToString().c_str());
    return 2;
  }
  const std::string token = chosen->token;
  std::string local_host, data_host;
  int local_port = 0, data_port = 0;
  if (!SplitHostPort(f.local, &local_host, &local_port) ||
      !SplitHostPort(f.data, &data_host, &data_port)) {
    std::fprintf(stderr, "error: --local-listen and --data-listen take host:port\n");
    return 2;
  }
  if (local_host != "127.0.0.1" && local_host != "localhost") {
    std::fprintf(stderr, "error: the local API binds loopback only (127.0.0.1)\n");
    return 2;
  }
  if (auto servers = tessera::http::ServerList::Parse(f.server, "--server"); !servers.ok()) {
    return Fail("", servers.status());
  }
  auto acceptor = StartDataPlane(data_host, data_port, token);
  if (!acceptor.ok()) return Fail("data plane: ", acceptor.status());
  const int bound_data = (*acceptor)->port();
  if (f.advertise.empty()) f.advertise = data_host == "0.0.0.0" ? "127.0.0.1" : data_host;
  tessera::storage::Env* env = seams.env ? seams.env : tessera::storage::DefaultEnv();
  if (!f.tls_ca.empty()) tessera::http::SetDefaultCaFile(f.tls_ca);

  tessera::worker::AgentOptions aopts = f.agent;
  aopts.around_task = seams.around_task;
  aopts.after_memory_exchange = seams.after_memory_exchange;
  aopts.server = f.server;
  aopts.token = token;
  aopts.name = f.name;
  aopts.devices = f.devices;
  aopts.data_port = bound_data;
  aopts.host = f.advertise;
  aopts.io_threads = f.io_threads;
  tessera::worker::Agent agent(aopts, env);
  RaiseOpenFileLimit();
  tessera::worker::TensorStoreOptions sopts;
  sopts.shm_dir = f.shm_dir;
  sopts.copy_threads = f.copy_threads;
  if (int n = tessera::worker::RemoveOrphanedShmFiles(f.shm_dir); n > 0) {
    std::fprintf(stderr, "removed %d mapping files left by workers that died\n", n);
  }
  tessera::worker::TensorStore store(agent.Resolver(), sopts);
  agent.SetStore(&store);
  tessera::worker::MeshCollectives collectives(acceptor->get(), agent.DataAddresses());
  agent.SetCollectives(&collectives);
  tessera::worker::MemoryChannel memory_channel(acceptor->get(), agent.DataAddresses(), f.memory_full_mesh_max);
  agent.SetMemoryChannel(&memory_channel);

  auto router = std::make_shared<tessera::http::Router>();
  tessera::worker::AddLocalRoutes(router.get(), &store, &agent, &collectives);
  auto credential = tessera::http::NewLocalCredential();
  if (!credential.ok()) return Fail("", credential.status());
  tessera::http::Server http(router, LocalApiOptions(local_port, *credential));
  auto bound = http.Bind();
  if (!bound.ok()) return Fail("", bound.status());
  std::string cred_path = f.local_credential.empty()
                              ? tessera::http::DefaultLocalCredentialPath(*bound)
                              : f.local_credential;
  http.set_token_hint("the token is this worker's local credential, in " + cred_path +
                      " (readable by the worker's user only)");
  if (auto st = tessera::http::WriteLocalCredential(cred_path, *credential); !st.ok()) {
    return Fail("local API credential: ", st);
  }
  std::printf("listening on http://127.0.0.1:%d\n", *bound);
  std::printf("local credential: %s\n", cred_path.c_str());
  std::printf("data plane on %s:%d\n", data_host.c_str(), bound_data);
  std::fflush(stdout);
  // Register with the real local port, now that it is known.
  agent.SetLocalPort(*bound);
  if (auto st = agent.Register(30000); !st.ok()) {
    return Fail("cannot register with " + f.server + ": ", st);
  }
  std::printf("registered as %s with %s\n", agent.id().c_str(), f.server.c_str());
  std::fflush(stdout);
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "error: pipe: %s\n", std::strerror(errno));
    return 1;
  }
  ServeUntilSignalled(http, agent);
  ::unlink(cred_path.c_str());
  agent.Stop();
  return 0;
}

}  // namespace tessera::worker
