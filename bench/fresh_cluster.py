"""What bench/dcp.py and bench/jax_orbax.py share: a fresh cluster per mode whose
workers' added memory is measured, a free port for the trainers' own process group,
and the trainers' answers."""

import json
import os
import shutil
import socket
import tempfile

from proc_status import reset_peak, status_kb
from tessera.local import LocalCluster


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(work, prefix, devices_per_worker=1):
    """A fresh tesserad and 4 workers for one mode: shared memory in /dev/shm, the
    checkpoint root under `work` (the peers' disk). Returns (cluster, root)."""
    root = os.path.join(work, "root")
    cluster = LocalCluster(workers=4, devices_per_worker=devices_per_worker,
                           dir=tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"),
                           checkpoint_root=root, heartbeat_ms=500, lease_ms=5000, copy_threads=2)
    return cluster, root


def collect(procs, what):
    """The last stdout line (JSON) of each process, in order; a failed one raises,
    with its stderr's end."""
    out = []
    for i, p in enumerate(procs):
        stdout, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError("%s %d failed:\n%s" % (what, i, err[-3000:]))
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def workers_rss(cluster):
    """Each worker's VmRSS now (kB), before the mode's saves; their peaks start here."""
    for p in cluster.workers:
        reset_peak(p.pid)
    return [status_kb(p.pid, "VmRSS") for p in cluster.workers]


def mode_row(mode, key, answers, cluster, rss):
    """One mode's row: the trainers' answers under `key`, and (ours) what the workers'
    VmHWM grew over `rss`, summed."""
    row = {"mode": mode, key: answers}
    if cluster is not None:
        row["workers_added_kb"] = sum(max(0, status_kb(p.pid, "VmHWM") - r)
                                      for p, r in zip(cluster.workers, rss))
    return row


def clean_up(cluster, work):
    """Stops the mode's cluster (its mappings' directory too) and removes its files."""
    if cluster is not None:
        shutil.rmtree(cluster.dir, ignore_errors=True)
        cluster.stop()
    shutil.rmtree(work, ignore_errors=True)
