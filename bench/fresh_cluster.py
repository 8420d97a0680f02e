"""What bench/dcp.py and bench/jax_orbax.py share: a free port for the trainers' own
process group, and a fresh cluster per mode whose workers' added memory is measured."""

import shutil
import socket

from proc_status import status_kb


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workers_rss(cluster):
    """Each worker's VmRSS now (kB), before the mode's saves."""
    return [status_kb(p.pid, "VmRSS") for p in cluster.workers]


def workers_added_kb(cluster, rss):
    """What the workers' VmHWM grew over `rss`, summed."""
    return sum(max(0, status_kb(p.pid, "VmHWM") - r) for p, r in zip(cluster.workers, rss))


def clean_up(cluster, work):
    """Stops the mode's cluster (its mappings' directory too) and removes its files."""
    if cluster is not None:
        shutil.rmtree(cluster.dir, ignore_errors=True)
        cluster.stop()
    shutil.rmtree(work, ignore_errors=True)
