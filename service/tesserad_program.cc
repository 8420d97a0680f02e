// tesserad's program: the control plane.
#include "service/tesserad_program.h"

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "api/thread_annotations.h"
#include "http/bearer_token.h"
#include "http/local_credential.h"
#include "http/server.h"
#include "service/dashboard.h"
#include "service/leadership.h"
#include "service/root_fence.h"
#include "service/service.h"
#include "service/standby_routes.h"
#include "storage/env.h"
#include "storage/s3/s3_env.h"
#include "storage/s3/transport.h"

namespace {

// The token from --token-file, --token (warned: visible in /proc), TESSERA_TOKEN,
// or else <data_dir>/token (created 0600 with a fresh random token). `source`
// says which, for the start-up lines: the token itself is never printed.
tessera::Result<std::string> LoadToken(const std::string& flag, const std::string& file,
                                       const std::string& data_dir, std::string* source) {
  ASSIGN_OR_RETURN(tessera::http::ChosenToken chosen,
                   tessera::http::ChooseToken(flag, file, "tesserad"));
  if (!chosen.token.empty()) {
    *source = chosen.source;
    return chosen.token;
  }
  const std::string path = data_dir + "/token";
  *source = "the file " + path;
  if (::access(path.c_str(), F_OK) == 0) return tessera::http::ReadTokenFile(path);
  ASSIGN_OR_RETURN(std::string token, tessera::http::NewLocalCredential());
  RETURN_IF_ERROR(tessera::http::WriteLocalCredential(path, token));
  return token;
}

// The data dir holds the catalog and the token: only this user may enter it, and
// the catalog's files (and those SQLite makes beside it, which take its mode)
// only this user may read.
tessera::Status KeepPrivate(const std::string& data_dir) {
  if (::chmod(data_dir.c_str(), 0700) != 0) return tessera::ErrnoStatus(errno, "chmod 700", data_dir);
  const std::string catalog = data_dir + "/catalog.sqlite";
  int fd = ::open(catalog.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return tessera::ErrnoStatus(errno, "create", catalog);
  ::fchmod(fd, 0600);
  ::close(fd);
  for (const char* suffix : {"-wal", "-shm"}) (void)::chmod((catalog + suffix).c_str(), 0600);
  return tessera::Status::Ok();
}

// The command line.
struct Flags {
  std::string listen = "127.0.0.1:7070", data_dir = "tessera-data", root, token, token_file;
  std::string web_dir, s3_endpoint, tls_cert, tls_key, ha, advertise;
  int threads = 256, header_timeout_s = 10;
  int64_t ha_lease_s = 5, root_lease_ms = 10000;
  int64_t heartbeat_ms = 500, lease_ms = 3000, gc_interval_ms = 5 * 60 * 1000;
  int64_t join_wait_ms = tessera::service::ServiceOptions{}.join_wait_ms;
  int64_t job_history_per_mesh = tessera::service::ServiceOptions{}.job_history_per_mesh;
  int64_t job_history_min_age_s = tessera::service::ServiceOptions{}.job_history_min_age_ms / 1000;
};

void AddFlags(CLI::App& app, Flags* f) {
  app.add_option("--listen", f->listen, "host:port to bind (port 0: any free port)");
  app.add_option("--data-dir", f->data_dir, "catalog, token");
  app.add_option("--checkpoint-root", f->root, "where checkpoints live: a directory every worker can reach, or s3://BUCKET/PREFIX (default <data-dir>/checkpoints)");
  app.add_option("--s3-endpoint", f->s3_endpoint, "the S3 server of an s3:// root, e.g. http://10.0.0.5:7480 (else TESSERA_S3_ENDPOINT); workers learn it from here unless they set their own. Credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION");
  app.add_option("--token-file", f->token_file,
                 "read the bearer token from this file (mode 0600); else TESSERA_TOKEN, else "
                 "<data-dir>/token, created with a random token");
  app.add_option("--token", f->token,
                 "the bearer token itself: every local user can read it in /proc (warned); "
                 "prefer --token-file or TESSERA_TOKEN");
  app.add_option("--threads", f->threads, "HTTP threads; each worker's task long-poll, each SSE client and each waiting barrier, KV or sync call holds one, so keep it above the number of workers plus waiting ranks")
      ->check(CLI::Range(4, 4096));
  app.add_option("--heartbeat-ms", f->heartbeat_ms, "worker heartbeat interval")->check(CLI::Range(10, 60000));
  app.add_option("--lease-ms", f->lease_ms, "a worker silent this long is dead")->check(CLI::Range(50, 600000));
  app.add_option("--join-wait-ms", f->join_wait_ms,
                 "a save from the training loop fails, naming the workers whose trainers did "
                 "not call save(), when they have not by then")
      ->check(CLI::Range(int64_t{100}, int64_t{86400000}))
      ->capture_default_str();
  app.add_option("--gc-interval-ms", f->gc_interval_ms, "remove leftovers of failed saves this often (0: at startup only)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}));
  app.add_option("--job-history", f->job_history_per_mesh,
                 "keep the last N finished jobs of each mesh (older ones are forgotten once past "
                 "--job-history-min-age-s; checkpoints are not jobs and stay)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--job-history-min-age-s", f->job_history_min_age_s,
                 "keep every finished job at least this long, past --job-history too")
      ->check(CLI::Range(int64_t{0}, int64_t{86400 * 365}))
      ->capture_default_str();
  app.add_option("--tls-cert", f->tls_cert, "serve HTTPS with this PEM certificate chain (with --tls-key); clients verify it with --tls-ca / TESSERA_TLS_CA")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", f->tls_key, "the PEM private key of --tls-cert")->check(CLI::ExistingFile);
  app.add_option("--header-timeout-s", f->header_timeout_s, "a client must send a whole request header within this; slower ones get 408")
      ->check(CLI::Range(1, 3600));
  app.add_option("--web-dir", f->web_dir, "serve the dashboard from this directory (default: the copy built in)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--ha", f->ha,
                 "run as one of several tesserads sharing --checkpoint-root: the one that holds "
                 "the leader key in etcd leads, the others stand by and take over when it goes "
                 "(etcd://HOST:PORT[,HOST:PORT...][/PREFIX], default prefix /tessera; docs/ha.md)");
  app.add_option("--ha-lease-s", f->ha_lease_s, "the leader's etcd lease: a standby takes over within about this long")
      ->check(CLI::Range(int64_t{2}, int64_t{600}))
      ->capture_default_str();
  app.add_option("--advertise", f->advertise,
                 "the URL clients reach this tesserad at, as standbys name it (default: from --listen, "
                 "with this host's name for 0.0.0.0)");
  app.add_option("--root-lease-ms", f->root_lease_ms,
                 "the lease on --checkpoint-root: a tesserad that finds the root held waits this long "
                 "for a renewal before it takes the root over")
      ->check(CLI::Range(int64_t{300}, int64_t{600000}))
      ->capture_default_str();
  app.set_version_flag("--version", TESSERA_VERSION);
}

tessera::service::ServiceOptions ServiceOptionsOf(const Flags& f) {
  tessera::service::ServiceOptions opts;
  opts.job_history_per_mesh = f.job_history_per_mesh;
  opts.job_history_min_age_ms = f.job_history_min_age_s * 1000;
  opts.data_dir = f.data_dir;
  opts.checkpoint_root = f.root;
  if (tessera::storage::IsS3Path(f.root)) opts.s3_endpoint = tessera::storage::DefaultS3Endpoint();
  opts.heartbeat_ms = f.heartbeat_ms;
  opts.lease_ms = f.lease_ms;
  opts.join_wait_ms = f.join_wait_ms;
  opts.gc_interval_ms = f.gc_interval_ms;
  opts.suspect_ms = std::max<int64_t>(f.heartbeat_ms * 3, f.lease_ms / 2);
  return opts;
}

// `metrics`: where requests are counted, once there (requests come only after it is).
tessera::http::ServerOptions ServerOptionsOf(const Flags& f, const std::string& host, int port,
                                             const std::string& token,
                                             const std::atomic<tessera::service::Metrics*>* metrics) {
  tessera::http::ServerOptions sopts;
  sopts.host = host;
  sopts.port = port;
  sopts.threads = f.threads;
  sopts.token = token;
  // JSON bodies: 2 MiB; only a save's create-or-join, which lists a snapshot's
  // tensors, may be larger (its route's limit).
  sopts.max_json_body_bytes = 2 << 20;
  sopts.max_body_bytes = 32 << 20;
  sopts.read_timeout_s = 30;
  sopts.write_timeout_s = 120;
  sopts.header_timeout_s = f.header_timeout_s;
  sopts.tls_cert_file = f.tls_cert;
  sopts.tls_key_file = f.tls_key;
  // Heartbeats, task polls and reports keep threads of their own, as many as
  // the general pool: every worker's task long-poll holds one of them, and the
  // heartbeats must still find one free (a pool of 8 let 16 workers' polls take
  // every thread, and the workers were declared dead).
  sopts.reserved_prefix = "/api/v1/workers/";
  sopts.reserved_threads = f.threads;
  sopts.on_request = [metrics](const tessera::http::Request& req, const std::string& pattern,
                               int status, double) {
    if (auto* m = metrics->load()) m->CountRequest(pattern.empty() ? "unmatched" : pattern, req.method, status);
  };
  return sopts;
}

int Fail(const tessera::Status& st) {
  std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
  return 1;
}

// The URL others reach this tesserad at.
std::string AdvertisedUrl(const Flags& f, const std::string& host, int port) {
  if (!f.advertise.empty()) return f.advertise;
  std::string h = host;
  if (h.empty() || h == "0.0.0.0" || h == "::") {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    h = name;
  }
  return std::string(f.tls_cert.empty() ? "http" : "https") + "://" + h + ":" + std::to_string(port);
}

// The process's lifetime: what the signal thread stops, and why the process ends.
struct Lifetime {
  tessera::Mutex mu;
  std::atomic<bool> stop{false};
  std::atomic<int> exit_code{0};
  pthread_t stopper GUARDED_BY(mu){};
  // The server that serves now: a standby's, then the leader's. Swapped and stopped
  // under server_mu, so that one is never stopped while it goes away.
  tessera::Mutex server_mu;
  tessera::http::Server* server GUARDED_BY(server_mu) = nullptr;
  std::atomic<tessera::service::Service*> service{nullptr};
  std::atomic<tessera::service::Leadership*> leadership{nullptr};

  // Ends the process from any thread (a lost lease, a newer epoch): as a signal would.
  void Depose(const tessera::Status& why) {
    std::fprintf(stderr, "error: %s; stopping\n", why.ToString().c_str());
    exit_code = 3;
    Signal();
  }
  // Wakes the signal thread, unless it is gone already.
  void Signal() {
    tessera::MutexLock lock(mu);
    if (stopper_running) pthread_kill(stopper, SIGTERM);
  }
  // Ends the signal thread (waking it if nothing did) and waits for it.
  void JoinStopper(std::thread& t) {
    {
      tessera::MutexLock lock(mu);
      pthread_kill(stopper, SIGTERM);
      stopper_running = false;
    }
    t.join();
  }
  bool stopper_running GUARDED_BY(mu) = true;
  void SetServer(tessera::http::Server* s) {
    tessera::MutexLock lock(server_mu);
    server = s;
  }
  // The signal thread's work: wake the campaign, fail running jobs, stop serving.
  void StopAll() {
    stop = true;
    if (auto* l = leadership.load()) l->Interrupt();
    if (auto* s = service.load()) s->Stop();
    tessera::MutexLock lock(server_mu);
    if (server) server->Stop();
  }
};

// With --ha: serves as a standby (standby_routes.h) on the listening address until this
// tesserad leads; the port it bound (that of --listen, or the one chosen for port 0).
tessera::Result<int> StandBy(const Flags& f, const std::string& host, int port, const std::string& token,
                             tessera::service::Leadership* leadership, Lifetime* life,
                             std::string* url) {
  auto router = std::make_shared<tessera::http::Router>();
  const std::atomic<tessera::service::Metrics*> none{nullptr};
  tessera::http::Server standby(router, ServerOptionsOf(f, host, port, token, &none));
  ASSIGN_OR_RETURN(int bound, standby.Bind());
  *url = AdvertisedUrl(f, host, bound);
  tessera::service::AddStandbyRoutes(router.get(), leadership, *url);
  std::printf("standby: listening on %s, campaigning in %s\n", url->c_str(), f.ha.c_str());
  std::fflush(stdout);
  life->SetServer(&standby);
  standby.Start();
  tessera::Status st = leadership->Campaign(*url, life->stop);
  life->SetServer(nullptr);
  standby.Stop();
  if (!st.ok()) return st;
  std::printf("leading: %s holds %s\n", url->c_str(), leadership->key().c_str());
  return bound;
}

}  // namespace

namespace tessera::service {

int RunTesserad(int argc, char** argv, const ServerSeams& seams) {
  if (seams.s3_transport) tessera::storage::s3::SetDefaultTransport(seams.s3_transport);
  CLI::App app{"tesserad: Tessera control plane"};
  Flags f;
  AddFlags(app, &f);
  CLI11_PARSE(app, argc, argv);

  // SIGINT / SIGTERM go to a thread of their own (sigwait) rather than a handler,
  // so stopping may take locks: it wakes barrier, KV and long-poll waiters first,
  // then stops the HTTP server, which joins its threads. Blocked before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  size_t colon = f.listen.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "error: --listen must be host:port\n");
    return 2;
  }
  const std::string host = f.listen.substr(0, colon);
  const int port = std::atoi(f.listen.c_str() + colon + 1);
  if (f.root.empty()) f.root = f.data_dir + "/checkpoints";

  tessera::storage::Env* env = seams.env ? seams.env : tessera::storage::DefaultEnv();
  if (auto st = env->CreateDirs(f.data_dir); !st.ok()) return Fail(st);
  if (auto st = KeepPrivate(f.data_dir); !st.ok()) return Fail(st);
  std::string token_source;
  auto token = LoadToken(f.token, f.token_file, f.data_dir, &token_source);
  if (!token.ok()) return Fail(token.status());
  if (!f.s3_endpoint.empty()) tessera::storage::SetDefaultS3Endpoint(f.s3_endpoint);

  Lifetime life;
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    life.StopAll();
  });
  {
    tessera::MutexLock lock(life.mu);
    life.stopper = stopper.native_handle();
  }
  auto finish = [&](int code) {
    life.JoinStopper(stopper);
    return life.exit_code != 0 ? life.exit_code.load() : code;
  };

  std::unique_ptr<tessera::service::Leadership> leadership;
  int listen_port = port;
  std::string url = AdvertisedUrl(f, host, port);
  if (!f.ha.empty()) {
    auto opened = tessera::service::Leadership::Open({f.ha, f.root, f.ha_lease_s});
    if (!opened.ok()) return finish(Fail(opened.status()));
    leadership = std::move(*opened);
    life.leadership = leadership.get();
    auto bound = StandBy(f, host, port, *token, leadership.get(), &life, &url);
    if (life.stop) return finish(0);
    if (!bound.ok()) return finish(Fail(bound.status()));
    listen_port = *bound;
    // Kept alive from now on: rebuilding the catalog from the root may take longer than a lease.
    leadership->Start([&life](const tessera::Status& why) { life.Depose(why); });
  }
  // Bound before the root is taken, so that its epoch names the address it serves on.
  auto router = std::make_shared<tessera::http::Router>();
  std::atomic<tessera::service::Metrics*> metrics{nullptr};
  tessera::http::Server server(router, ServerOptionsOf(f, host, listen_port, *token, &metrics));
  auto bound = server.Bind();
  if (!bound.ok()) return finish(Fail(bound.status()));
  if (f.ha.empty()) url = AdvertisedUrl(f, host, *bound);
  auto fence = tessera::service::RootFence::Acquire(
      env, {f.root, url, f.ha, f.root_lease_ms},
      [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  if (!fence.ok()) return finish(Fail(fence.status()));
  if (leadership) (*fence)->SetLeaderCheck([l = leadership.get()] { return l->Check(); });
  (*fence)->Start([&life](const tessera::Status& why) { life.Depose(why); });
  const int64_t since_ms = tessera::WallMs();
  tessera::service::ServiceOptions options = ServiceOptionsOf(f);
  options.epoch = (*fence)->epoch();
  options.after_poll = seams.after_poll;
  options.fence = [fence = fence->get()](const std::string& what) { return fence->Check(what); };
  options.leadership = [&f, url, since_ms, epoch = (*fence)->epoch()] {
    return tessera::Json{{"role", "leader"}, {"self", url}, {"leader", url}, {"leader_since_ms", since_ms},
                         {"epoch", epoch}, {"ha", f.ha}};
  };
  auto service = tessera::service::Service::Create(std::move(options), env);
  if (!service.ok()) return finish(Fail(service.status()));
  metrics = (*service)->metrics();
  (*service)->AddRoutes(router.get());
  tessera::service::AddDashboardRoutes(router.get(), f.web_dir);
  const char* scheme = server.tls() ? "https" : "http";
  std::printf("listening on %s://%s:%d\n", scheme, host.c_str(), *bound);
  std::printf("token: from %s\n", token_source.c_str());
  std::printf("dashboard: %s://%s:%d/ (sign in with the token)\n", scheme, host.c_str(), *bound);
  (*service)->SetServerStats([&server] { return server.stats(); });
  std::printf("data dir: %s, checkpoint root: %s (epoch %lld)\n", f.data_dir.c_str(), f.root.c_str(),
              static_cast<long long>((*fence)->epoch()));
  std::fflush(stdout);
  life.service = service->get();
  life.SetServer(&server);
  (*service)->Start();
  if (!life.stop) server.Run();
  const int code = finish(0);
  (*service)->Stop();
  (*fence)->Stop(/*release=*/code == 0);
  if (leadership && code == 0) leadership->Resign();
  std::fprintf(stderr, "tesserad stopped\n");
  return code;
}

}  // namespace tessera::service
