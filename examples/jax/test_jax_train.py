"""train.py as 4 JAX processes, each with its worker: a run stopped after step 7 and
started again resumes from the checkpoint of step 4 (Orbax's CheckpointManager through
tessera.orbax) and logs the same losses, bit for bit, as a run that never stopped."""

import importlib.util
import os
import re
import socket
import subprocess
import sys

import pytest

if importlib.util.find_spec("orbax") is None:  # not imported here: JAX warns at every fork
    pytest.skip("orbax-checkpoint is not installed", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from tessera.local import LocalCluster  # noqa: E402

STEP = re.compile(r"^step (\d+) loss (\S+)$", re.M)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(workers=4, devices_per_worker=2) as c:
        yield c


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(cluster, mesh, directory, *extra):
    """Runs train.py as 4 processes; process 0's {step: loss}."""
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "train.py"), "--proc", str(p), "--nproc", "4",
         "--port", str(port), "--mesh", mesh, "--worker", cluster.worker_urls[p], "--dir",
         directory] + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env) for p in range(4)]
    outs = []
    for p, proc in enumerate(procs):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, "process %d:\n%s" % (p, err[-4000:])
        outs.append(out)
    return {int(s): loss for s, loss in STEP.findall(outs[0])}


def test_a_stopped_run_resumes_bit_for_bit(cluster, tmp_path):
    client = cluster.client(timeout=30)
    for mesh in ("straight", "resumed"):
        client.register_mesh(mesh, {"data": 4, "model": 2}, devices_per_worker=2,
                             workers=cluster.worker_ids)
    straight = train(cluster, "straight", str(tmp_path / "straight"))
    assert sorted(straight) == list(range(12))
    first = train(cluster, "resumed", str(tmp_path / "resumed"), "--stop-at", "7")
    assert sorted(first) == list(range(8))
    second = train(cluster, "resumed", str(tmp_path / "resumed"))
    assert sorted(second) == list(range(5, 12))  # from the checkpoint of step 4
    assert all(second[s] == straight[s] for s in second), (second, straight)
    steps = sorted(c["step"] for c in client.checkpoints("resumed") if c["state"] == "committed")
    assert steps == [4, 9], steps
