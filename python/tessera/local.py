"""A cluster on this machine: tesserad plus N tessera-worker processes on
127.0.0.1, for examples, tests and trying things out.

    with LocalCluster(workers=4) as cluster:
        client = cluster.client()
        client.register_mesh("train", {"data": 4})
        cluster.worker_urls[0]   # the local API of worker 0, for a trainer
"""

import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from .client import Client
from .errors import TesseraError

_LISTENING = re.compile(r"listening on (https?://[0-9.]+:[0-9]+)")
_REGISTERED = re.compile(r"registered as (\S+)")


def _die_with_parent():
    """Runs in the child: SIGKILL it when the process that started it dies. Linux sends
    it when the *thread* that started the child ends, so a test that restarts processes
    from a thread of its own keeps that thread alive as long as they must live."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def find_bin_dir(bin_dir=None):
    """Where tesserad and tessera-worker are: bin_dir, env TESSERA_BIN, or the
    build/bin of the source tree this package sits in."""
    candidates = [bin_dir, os.environ.get("TESSERA_BIN"),
                  os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin")]
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "tesserad")):
            return os.path.abspath(c)
    raise TesseraError("not_found", "no tesserad found in %s: set TESSERA_BIN to the directory "
                       "holding tesserad and tessera-worker" % [c for c in candidates if c], 0,
                       {"field": "bin_dir"})


def program(name, env=None):
    """`name`, or its test twin `name`-faults when `env` sets a TESSERA_FAULT_* hook: the
    shipped tesserad and tessera-worker know no fault hooks (tests/faults/fault_hooks.h)."""
    if env and any(k.startswith("TESSERA_FAULT_") for k in env):
        return name + "-faults"
    return name


def make_self_signed_cert(directory, host="127.0.0.1"):
    """Writes tls-cert.pem and tls-key.pem (a self-signed certificate for `host`,
    made by the openssl command) into `directory`; returns the certificate's path."""
    cert = os.path.join(directory, "tls-cert.pem")
    key = os.path.join(directory, "tls-key.pem")
    san = "IP:" + host if host.replace(".", "").isdigit() else "DNS:" + host
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "30", "-subj",
                        "/CN=" + host, "-addext", "subjectAltName=" + san, "-keyout", key,
                        "-out", cert], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise TesseraError("unavailable", "cannot make a TLS certificate with openssl: %s" % e,
                           0, {"field": "tls"}) from None
    os.chmod(key, 0o600)
    os.chmod(key, 0o600)  # tesserad refuses a key other users can read
    return cert


class Process:
    """One started program, with its log file."""

    def __init__(self, argv, log, env=None, ready=_LISTENING, timeout=20.0):
        self.argv = argv
        self.log = log
        # A restarted program appends to its log: only what this run writes counts.
        self.start = os.path.getsize(log) if os.path.exists(log) else 0
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          preexec_fn=_die_with_parent)
        self.pid = self.popen.pid
        self.url = self.wait_for(ready, timeout)

    def text(self):
        """What this run has written to the log."""
        with open(self.log, "rb") as f:
            f.seek(self.start)
            return f.read().decode("utf-8", "replace")

    def wait_for(self, pattern, timeout):
        """The first group of `pattern` once the log shows it."""
        deadline = time.monotonic() + timeout
        while True:
            m = pattern.search(self.text())
            if m:
                return m.group(1)
            if self.popen.poll() is not None:
                raise TesseraError("unavailable", "%s exited with %s during start-up; its log "
                                   "%s says: %s" % (self.argv[0], self.popen.returncode, self.log,
                                                    self.text()[-2000:]), 0,
                                   {"endpoint": self.argv[0]})
            if time.monotonic() > deadline:
                self.kill()
                raise TesseraError("deadline_exceeded", "%s did not print %r within %g s; see %s"
                                   % (self.argv[0], pattern.pattern, timeout, self.log), 0,
                                   {"endpoint": self.argv[0]})
            time.sleep(0.01)

    def alive(self):
        return self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        if sig == signal.SIGKILL:
            self.popen.wait()

    def stop(self, grace=3.0):
        """SIGTERM (workers then unlink their mappings), SIGKILL after `grace` s."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()


class LocalCluster:
    """tesserad plus `workers` tessera-worker processes (names host0, host1, ...),
    each worker's shared-memory mappings in <dir>/shm.

    heartbeat_ms / lease_ms: liveness (short ones make a killed worker dead fast).
    dir: where the catalog, checkpoints, mappings and logs go (default: a fresh
    temporary directory, removed by stop()).
    checkpoint_root: elsewhere for the checkpoints (a directory, or s3://BUCKET/PREFIX
    with server_args=["--s3-endpoint", URL]); server_args / server_env: more flags
    and environment for tesserad (a TESSERA_FAULT_* hook in server_env, or in a
    worker's env, starts the test program tesserad-faults or tessera-worker-faults).
    """

    def __init__(self, workers=4, bin_dir=None, dir=None, devices_per_worker=1,  # noqa: A002
                 heartbeat_ms=100, lease_ms=1500, token=None, copy_threads=1,
                 checkpoint_root=None, server_args=(), server_env=None, tls=False):
        self.bin_dir = find_bin_dir(bin_dir)
        self._own_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="tessera-py-")
        self.shm_dir = os.path.join(self.dir, "shm")
        os.makedirs(self.shm_dir, exist_ok=True)
        self.token = token or "tessera-py-%d-%d" % (os.getpid(), time.monotonic_ns())
        self.devices_per_worker = devices_per_worker
        self.copy_threads = copy_threads
        self.server = None
        # tls: tesserad serves HTTPS with a self-signed certificate made here,
        # which workers and client() trust (tls_ca).
        self.tls_ca = make_self_signed_cert(self.dir) if tls else None
        if tls:
            server_args = list(server_args) + [
                "--tls-cert", self.tls_ca, "--tls-key", os.path.join(self.dir, "tls-key.pem")]
        self.workers = []
        self.worker_ids = []
        self.worker_urls = []
        self._server_argv = (
            [os.path.join(self.bin_dir, program("tesserad", server_env)), "--listen",
             "127.0.0.1:0",
             "--data-dir", os.path.join(self.dir, "data"),
             "--heartbeat-ms", str(heartbeat_ms), "--lease-ms", str(lease_ms)] +
            (["--checkpoint-root", checkpoint_root] if checkpoint_root else []) +
            list(server_args))
        self._server_env = dict(os.environ, TESSERA_TOKEN=self.token, **(server_env or {}))
        try:
            self.start_server()
            for i in range(workers):
                self.workers.append(None)
                self.worker_ids.append(None)
                self.worker_urls.append(None)
                self.start_worker(i)
        except BaseException:
            self.stop()
            raise

    def start_server(self):
        """(Re)starts tesserad with the same data dir and checkpoint root; a restart
        listens on the port of the first start, so workers and clients find it again."""
        argv = list(self._server_argv)
        if self.server is not None:
            argv[argv.index("--listen") + 1] = self.server.split("://", 1)[1]
        self.server_process = Process(argv, os.path.join(self.dir, "tesserad.log"),
                                      env=self._server_env)
        self.server = self.server_process.url
        return self.server_process

    def kill_server(self):
        """SIGKILLs tesserad; start_server() brings it back on the same port."""
        self.server_process.kill()

    def start_worker(self, i, env=None, name=None):
        """(Re)starts worker i under its stable name host<i> (or `name`: a replacement
        under another name); `env`: variables to add."""
        argv = [os.path.join(self.bin_dir, program("tessera-worker", env)), "--server", self.server,
                "--name", name or "host%d" % i,
                "--devices", str(self.devices_per_worker), "--shm-dir", self.shm_dir,
                "--copy-threads", str(self.copy_threads)]
        if self.tls_ca:
            argv += ["--tls-ca", self.tls_ca]
        # The token goes in the environment, which only this user can read in /proc.
        p = Process(argv, os.path.join(self.dir, "worker-%d.log" % i),
                    env=dict(os.environ, TESSERA_TOKEN=self.token, **(env or {})))
        self.workers[i] = p
        self.worker_urls[i] = p.url
        self.worker_ids[i] = p.wait_for(_REGISTERED, 20.0)
        return p

    def kill_worker(self, i):
        self.workers[i].kill()

    def client(self, timeout=60.0):
        return Client(self.server, self.token, timeout=timeout, tls_ca=self.tls_ca)

    def env(self):
        """Environment variables for a program using this cluster (TESSERA_SERVER,
        _TOKEN, and _TLS_CA when it serves HTTPS)."""
        env = {"TESSERA_SERVER": self.server, "TESSERA_TOKEN": self.token}
        if self.tls_ca:
            env["TESSERA_TLS_CA"] = self.tls_ca
        return env

    def stop(self):
        """Kills every process (SIGKILL: the mappings are files under dir/shm, which
        goes with dir; a worker started there again removes any left over)."""
        for w in self.workers:
            if w is not None:
                w.kill()
        if getattr(self, "server_process", None) is not None:
            self.server_process.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
