"""Hosts for multi-host tests, on one machine: each host is a network namespace with
its own address on a bridge, and its own mount namespace with private /tmp and
/dev/shm. The checkout (build/bin, python/, tests/), TESSERA_BIN and the hosts' own
directory stay visible on every host at their paths, even under /tmp or /dev/shm.
Nothing passes between hosts except over the network and through the checkpoint
root `shared`, which every host sees at the same path:
  share="bind":  one directory of this machine, as a NAS would be;
  share="sshfs": host 0 exports a directory over SSH (its own sshd, on its own
                 address) and every other host mounts it with sshfs, so the files
                 cross the network.

Needs root (ip netns, unshare, nsenter from iproute2 and util-linux); sshfs needs
sshfs, openssh-server and /dev/fuse.

    with Hosts(5) as hosts:                  # host 0 at 10.x.y.10, host 1 at .11, ...
        p = hosts.start(1, ["tessera-worker", ...], "worker-1.log")
        hosts.run(1, ["python3", "trainer.py"])
        hosts.link_down(1); hosts.link_up(1)
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from tessera.local import Process  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PRIVATE = ("/tmp", "/dev/shm")  # a fresh tmpfs on each host


def sh(*argv, check=True):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr.strip()))
    return r.stdout


def _under(path, d):
    return path == d or path.startswith(d.rstrip("/") + "/")


def _kept_binds(paths):
    """(path, source) pairs: each path under a private directory that hosts must still
    see there, and where its files are once the tmpfs covers it. Fd 3 is the old /tmp
    and fd 4 the old /dev/shm, opened before the tmpfs covers them. A path is kept both
    as given and resolved, so that symlinks into or out of /tmp work too."""
    wanted = set()
    for p in paths:
        if p and os.path.exists(p):
            wanted.update({os.path.abspath(p), os.path.realpath(p)})
    binds = []
    for p in sorted(wanted):
        d = next((d for d in PRIVATE if _under(p, d)), None)
        if d is None or any(_under(p, kept) for kept, _ in binds):
            continue  # nothing hides it, or a kept directory holds it already
        if p == d:
            raise RuntimeError("hosts cannot keep %s itself: it is private to each host" % d)
        real = os.path.realpath(p)
        below = next((d for d in PRIVATE if _under(real, d)), None)
        source = real if below is None else os.path.join(
            "/proc/self/fd/%d" % (3 + PRIVATE.index(below)), os.path.relpath(real, below))
        binds.append((p, source))
    return binds


def _unescape(field):
    """A path as /proc/mounts writes it (space as \\040, and so on)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def can_run(share="bind"):
    """None when this process can build hosts, else why not."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    tools = ["ip", "unshare", "nsenter"]
    if share == "sshfs":
        tools += ["sshfs", "/usr/sbin/sshd", "ssh-keygen"]
        if not os.path.exists("/dev/fuse"):
            return "sshfs needs /dev/fuse"
    for tool in tools:
        if shutil.which(tool) is None:
            return "needs %s" % tool
    return None


class Hosts:
    _made = 0  # Hosts made by this process: each gets names of its own

    def __init__(self, n, dir=None, share="bind", keep=()):  # noqa: A002
        """keep: more directories that every host sees as this process does (the
        checkout, TESSERA_BIN and dir always are)."""
        self.n = n
        self.share = share
        # Names of its own per instance: a namespace that outlives close() (the
        # kernel tears it down when its last process is gone) keeps its veth, and
        # the next Hosts of this process must not collide with it.
        tag = "%05d%d" % (os.getpid() % 100000, Hosts._made % 10)
        Hosts._made += 1
        self.bridge = "tsb" + tag
        # A /24 per test process, so that several runs never share addresses.
        self.net = "10.%d.%d" % (100 + (os.getpid() >> 8) % 100, os.getpid() % 256)
        self.ns = ["ts%s-h%d" % (tag, i) for i in range(n)]
        self.veth = ["tsv%s%d" % (tag, i) for i in range(n)]
        self.dir = dir or tempfile.mkdtemp(prefix="tessera-mh-", dir="/var/tmp")
        self.shared = os.path.join(self.dir, "shared")
        os.makedirs(self.shared, exist_ok=True)
        # Where this process (outside the hosts) sees the shared files.
        self.shared_here = self.shared if share == "bind" else os.path.join(self.dir, "export")
        self.keep = [REPO, os.environ.get("TESSERA_BIN"), self.dir] + list(keep)
        self.anchors = []
        self.procs = []
        self.daemons = []  # sshd and the sshfs mounts: killed before the hosts go
        try:
            self._build()
            if share == "sshfs":
                self._share_over_ssh()
        except BaseException:
            self.close()
            raise

    def addr(self, i):
        return "%s.%d" % (self.net, 10 + i)

    def _build(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", self.net + ".1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, veth = self.ns[i], self.veth[i]
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", self.bridge, "up")
            sh("ip", "-n", ns, "addr", "add", self.addr(i) + "/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # The host's own /tmp and /dev/shm, held by a process that lives as long as
            # the host; every program of the host enters its namespaces. What must stay
            # visible there (the checkout may be under /tmp) is bound back at its path
            # from the old directories, reached through descriptors opened before the
            # tmpfs covers them (hence --no-canonicalize: resolving the source would
            # find the new /tmp).
            script = ('set -e; exec 3</tmp 4</dev/shm\n'
                      'mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /dev/shm\n'
                      'while [ $# -gt 0 ]; do\n'
                      '  mkdir -p "$1"; mount --no-canonicalize --rbind "$2" "$1"; shift 2\n'
                      'done\n'
                      'exec 3<&- 4<&-; echo ready; exec sleep infinity')
            binds = [arg for bind in _kept_binds(self.keep) for arg in bind]
            anchor = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private",
                 "sh", "-c", script, "sh"] + binds,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            self.anchors.append(anchor)
            if anchor.stdout.readline().strip() != b"ready":
                anchor.kill()
                _, err = anchor.communicate()
                raise RuntimeError("host %d: could not make its mount namespace: %s"
                                   % (i, err.decode(errors="replace").strip()))

    def _share_over_ssh(self):
        """Host 0 serves <dir>/export with sshd on its address; every host mounts it at
        `shared` (host 0 by a bind mount, the others with sshfs)."""
        export = os.path.join(self.dir, "export")
        ssh = os.path.join(self.dir, "ssh")
        os.makedirs(export)
        os.makedirs(ssh, mode=0o700)
        for key in ("host", "client"):
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(ssh, key))
        shutil.copy(os.path.join(ssh, "client.pub"), os.path.join(ssh, "authorized_keys"))
        config = os.path.join(ssh, "sshd_config")
        with open(config, "w") as f:
            f.write("ListenAddress %s:2222\nHostKey \"%s\"\nAuthorizedKeysFile \"%s\"\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                    "UsePAM no\nStrictModes no\nPidFile none\n"
                    "Subsystem sftp internal-sftp\n"
                    % (self.addr(0), os.path.join(ssh, "host"), os.path.join(ssh, "authorized_keys")))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        sshd = subprocess.Popen(self.command(0, ["/usr/sbin/sshd", "-D", "-e", "-f", config]),
                                stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(self.dir, "sshd.log"), "ab"))
        self.daemons.append(sshd)
        # sshd says so on stderr once it listens; a mount tried before that fails.
        deadline = time.monotonic() + 10
        while "Server listening" not in open(os.path.join(self.dir, "sshd.log")).read():
            if sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("sshd on host 0 did not start; see %s" % os.path.join(self.dir, "sshd.log"))
            time.sleep(0.02)
        self.run(0, ["mount", "--bind", export, self.shared])
        # A mount counts once this file, written here, reads back through it: sshfs can
        # show in /proc/mounts for a moment and then exit when its connection fails.
        marker = ".sshfs-%d" % os.getpid()
        with open(os.path.join(export, marker), "w") as f:
            f.write("ok\n")
        for i in range(1, self.n):
            deadline = time.monotonic() + 10
            while True:
                # -f: stays in the foreground, so that it is killed with the hosts.
                mount = subprocess.Popen(self.command(i, [
                    "sshfs", "-f", "-p", "2222", "root@%s:%s" % (self.addr(0), export), self.shared,
                    "-o", "IdentityFile=\"%s\",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,"
                          "LogLevel=ERROR,dir_cache=no,attr_timeout=0,entry_timeout=0"
                          % os.path.join(ssh, "client")]),
                    stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "sshfs-%d.log" % i), "ab"))
                mounted = False
                while mount.poll() is None and time.monotonic() < deadline and not mounted:
                    mounted = self.mount_type(i, self.shared) == "fuse.sshfs" and self.run(
                        i, ["cat", os.path.join(self.shared, marker)], check=False).strip() == "ok"
                    time.sleep(0.05)
                if mounted and mount.poll() is None:
                    self.daemons.append(mount)
                    break
                mount.kill()
                mount.wait()
                self.run(i, ["umount", "-l", self.shared], check=False)  # a mount it left behind
                if time.monotonic() > deadline:
                    raise RuntimeError("host %d could not mount %s over sshfs; see %s" % (
                        i, export, os.path.join(self.dir, "sshfs-%d.log" % i)))
        os.unlink(os.path.join(export, marker))

    def command(self, i, argv):
        """argv, run inside host i's namespaces."""
        return ["nsenter", "-t", str(self.anchors[i].pid), "-m", "-n", "--"] + list(argv)

    def start(self, i, argv, log, env=None, **kw):
        """A long-running program on host i (tessera.local.Process: waits until ready)."""
        p = Process(self.command(i, argv), os.path.join(self.dir, log), env=env, **kw)
        self.procs.append(p)
        return p

    def run(self, i, argv, env=None, timeout=120, check=True):
        """Runs argv on host i to its end; its stdout."""
        r = subprocess.run(self.command(i, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, timeout=timeout, text=True)
        if check and r.returncode != 0:
            raise RuntimeError("on host %d, %s exited %d: %s%s" % (
                i, " ".join(argv), r.returncode, r.stdout[-2000:], r.stderr[-4000:]))
        return r.stdout

    def popen(self, i, argv, env=None):
        return subprocess.Popen(self.command(i, argv), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True)

    def mount_type(self, i, path):
        """The type of what is mounted at path on host i (the topmost mount), or None."""
        kind = None
        for line in self.run(i, ["cat", "/proc/self/mounts"]).splitlines():
            fields = line.split(" ")
            if _unescape(fields[1]) == path:
                kind = fields[2]
        return kind

    def link_down(self, i):
        sh("ip", "link", "set", self.veth[i], "down")

    def link_up(self, i):
        sh("ip", "link", "set", self.veth[i], "up")

    def close(self):
        for p in self.procs:
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        for d in reversed(self.daemons):
            d.kill()
            d.wait()
        for a in self.anchors:
            a.kill()
            a.wait()
        # Deleting one end of a veth pair deletes both, at once, even while the
        # namespace of the other end is still being torn down.
        for veth in self.veth:
            sh("ip", "link", "del", veth, check=False)
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        if os.environ.get("TESSERA_KEEP_HOSTS_DIR"):
            print("hosts: logs kept in %s" % self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
