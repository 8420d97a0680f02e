"""tessera.jax: pytrees of sharded jax.Arrays through Tessera with 4 real JAX processes
(2 CPU devices each, an 8-device mesh of axes data x model), each with its own worker
(tests/jax_rank.py); restored onto 2 processes and another mesh; multihost_utils."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import tessera  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import free_port, running_cluster  # noqa: E402


def run_procs(cluster, mesh, mode, step, nproc=4, args=None, timeout=300, first=0, wrap=()):
    """Runs `nproc` JAX processes on workers first.. first+nproc-1 (each under the
    command `wrap`, if any); what each printed (None for the one args["die"] names,
    killed mid-save)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."), JAX_PLATFORMS="cpu",
               JAX_NUM_CPU_DEVICES="2")
    procs = [subprocess.Popen(
        list(wrap) + [sys.executable, os.path.join(HERE, "jax_rank.py"), str(p), str(nproc), str(port), mesh,
         cluster.worker_urls[first + p], mode, str(step), json.dumps(args or {})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for p in range(nproc)]
    seen = []
    for p, proc in enumerate(procs):
        out, err = proc.communicate(timeout=timeout)
        if (args or {}).get("die") == p:
            seen.append(None)
            continue
        if "die" in (args or {}) and proc.returncode != 0 and out.strip():
            # With a process killed, JAX's coordinator (process 0) may leave before the
            # others do and JAX then ends them: what they printed before is what counts.
            seen.append(json.loads(out.strip().splitlines()[-1]))
            continue
        assert proc.returncode == 0, "process %d: %s\n%s" % (p, out, err[-4000:])
        seen.append(json.loads(out.strip().splitlines()[-1]))
    return seen


@pytest.fixture(scope="module")
def cluster():
    """4 workers of 2 devices each: one per JAX process of 2 CPU devices; a save missing a
    process gives up after 3 s."""
    yield from running_cluster(devices_per_worker=2, server_args=["--join-wait-ms", "3000"])


@pytest.fixture(scope="module")
def client(cluster):
    return cluster.client(timeout=30)


@pytest.fixture
def jax_mesh(cluster, client, mesh_name):
    client.register_mesh(mesh_name, {"data": 4, "model": 2}, devices_per_worker=2,
                         workers=cluster.worker_ids)
    return mesh_name


def ptrace_allowed():
    """Whether a worker may read a trainer's memory here: Yama's ptrace scope (when the
    kernel has it) forbids it to all (3), or to a process that is not root (1, 2)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except (OSError, ValueError):
        return True
    return scope == 0 or (scope < 3 and os.geteuid() == 0)


def test_a_sharded_pytree_comes_back_bit_for_bit(cluster, client, jax_mesh):
    seen = run_procs(cluster, jax_mesh, "save", 3)
    # Each worker read its process's arrays where they are (where the kernel lets it).
    assert all(s["saved"] == 3 and s["borrowed"] is ptrace_allowed() for s in seen), seen
    record = client.checkpoint(jax_mesh, 3)
    by_name = {t["name"]: t for t in record["tensors"]}
    assert by_name["params/w"]["layout"] == ["data", "model"], by_name["params/w"]
    assert by_name["params/b"]["dtype"] == "bfloat16"
    seen = run_procs(cluster, jax_mesh, "restore", 3)
    assert all(s["same"] is True for s in seen), seen
    # Into other shardings of the same mesh: the workers reshard.
    specs = {"params/w": ["model", None], "params/b": [], "params/r": ["data", "model"],
             "opt/count": [], "opt/mu": ["model", None]}
    seen = run_procs(cluster, jax_mesh, "restore", 3, args={"specs": specs})
    assert all(s["same"] is True for s in seen), seen


def test_a_restore_onto_two_processes_and_another_mesh(cluster, client, jax_mesh, mesh_name):
    run_procs(cluster, jax_mesh, "save", 5)
    other = mesh_name + "-two"
    client.register_mesh(other, {"data": 2, "model": 2}, devices_per_worker=2,
                         workers=cluster.worker_ids[2:])
    specs = {"params/w": ["model", "data"], "params/b": ["model"], "params/r": [],
             "opt/count": [], "opt/mu": [None, "data"]}
    seen = run_procs(cluster, other, "restore", 5, nproc=2, first=2,
                     args={"shape": [2, 2], "specs": specs, "from_mesh": jax_mesh})
    assert all(s["same"] is True for s in seen), seen


def test_the_memory_tier_every_step_and_a_host_lost(cluster, client, jax_mesh):
    memory = {"save": {"tier": "memory", "replicas": 1, "keep": 2, "force": True}}
    for step in (7, 8):
        run_procs(cluster, jax_mesh, "save", step, args=memory)
    seen = run_procs(cluster, jax_mesh, "restore", 8, args={"latest": True})
    assert all(s["same"] is True and (s["tier"], s["source"]) == ("memory", "local")
               for s in seen), seen
    # Host 2 is lost with its RAM; a replacement starts under its name: its share comes
    # back from a peer's copy in the restore's first call (the agreement on the step),
    # and the worker keeps it with its redundancy (a reprotect), so the second call,
    # the load, finds every share in its own worker's RAM.
    cluster.kill_worker(2)
    cluster.start_worker(2)
    seen = run_procs(cluster, jax_mesh, "restore", 8, args={"latest": True})
    assert all(s["same"] is True and s["tier"] == "memory" for s in seen), seen
    assert [s["source"] for s in seen] == ["local"] * 4, seen
    with open(os.path.join(cluster.dir, "worker-2.log")) as f:
        assert "holds step 8 of mesh %s again" % jax_mesh in f.read()


def test_a_process_killed_mid_save_leaves_nothing_committed(cluster, client, jax_mesh):
    run_procs(cluster, jax_mesh, "save", 1)
    seen = run_procs(cluster, jax_mesh, "save", 2, args={"die": 1})
    for s in (seen[0], seen[2], seen[3]):
        assert "error" in s, seen
    committed = [c["step"] for c in client.checkpoints(jax_mesh) if c["state"] == "committed"]
    assert committed == [1], client.checkpoints(jax_mesh)
    assert all(s["saved"] == 3 for s in run_procs(cluster, jax_mesh, "save", 3))
    assert all(s["same"] is True for s in run_procs(cluster, jax_mesh, "restore", 3))


UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


def test_where_the_worker_cannot_read_the_process_its_arrays_are_copied(cluster, client,
                                                                        jax_mesh):
    # Trainers in PID namespaces of their own: the process a worker would read under the
    # pid it was given is another one (which does not hold the caller's token), so it
    # refuses, and the trainer copies its arrays into the worker's shared memory instead.
    try:
        subprocess.run(UNSHARE + ("true",), check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("no PID namespaces here (unshare needs root)")
    seen = run_procs(cluster, jax_mesh, "save", 11, wrap=UNSHARE)
    assert all(s["saved"] == 11 and s["borrowed"] is False for s in seen), seen
    assert all(s["same"] is True for s in run_procs(cluster, jax_mesh, "restore", 11,
                                                    wrap=UNSHARE)), seen
    # And the copying path chosen outright gives the same checkpoint.
    seen = run_procs(cluster, jax_mesh, "save", 12, args={"copy": True})
    assert all(s["saved"] == 12 and s["borrowed"] is False for s in seen), seen
    assert all(s["same"] is True for s in run_procs(cluster, jax_mesh, "restore", 12))


def test_orbax_checkpoint_manager_through_tessera(cluster, client, jax_mesh, tmp_path):
    seen = run_procs(cluster, jax_mesh, "orbax", 4, args={"dir": str(tmp_path / "orbax")})
    assert all(s["same"] is True and s["steps"] == [4] for s in seen), seen
    assert [c["step"] for c in client.checkpoints(jax_mesh) if c["state"] == "committed"] == [4]
    assert json.loads((tmp_path / "orbax" / "4" / "default" / "tessera.json").read_text()) == {
        "mesh": jax_mesh, "step": 4}


def test_multihost_utils_match_jax_and_name_who_did_not_come(cluster, jax_mesh):
    seen = run_procs(cluster, jax_mesh, "multihost", 0)
    assert not any("differs" in s for s in seen), seen
    assert all("processes [2]" in s["assert"] for s in seen), seen
    for s in seen[:3]:
        assert s["late"]["code"] == "deadline_exceeded" and s["late"]["missing"] == [3], s


def test_one_process_reads_it_whole_and_what_a_restore_cannot_do_is_named(cluster, client,
                                                                          jax_mesh):
    """One process of one device restores the 4-process checkpoint whole; a checkpoint
    not saved by tessera.jax, a leaf the checkpoint lacks, another dtype or shape, a
    target that is no sharded array: each refused naming it, before anything is read."""
    import tessera.jax as tjax  # noqa: PLC0415
    ms = [tessera.CheckpointManager(jax_mesh, worker=cluster.worker_urls[w], timeout=30)
          for w in range(4)]
    try:
        for m in ms:
            for d in m.devices:
                m.attach("t", (8,), "float32", layout=["data"], device=d)[:] = d
        for h in [m.save(1) for m in ms]:
            h.wait(60)
    finally:
        for m in ms:
            m.close()
    run_procs(cluster, jax_mesh, "save", 2)
    sds = jax.ShapeDtypeStruct
    with tjax.Checkpointer(jax_mesh, worker=cluster.worker_urls[0], timeout=30) as ckpt:
        with pytest.raises(tessera.TesseraError) as e:
            ckpt.restore(1, {"t": sds((8,), np.float32)}, from_mesh=jax_mesh)
        assert e.value.code == "failed_precondition" and "tessera.jax" in str(e.value)
        with pytest.raises(tessera.TesseraError) as e:
            ckpt.restore(2, {"params": {"nope": sds((8,), np.float32)}}, from_mesh=jax_mesh)
        assert e.value.code == "not_found" and e.value.details["tensor"] == "['params']['nope']"
        with pytest.raises(tessera.TesseraError) as e:
            one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            ckpt.restore(2, {"params": {"w": sds((16, 4), np.float32, sharding=one)}},
                         from_mesh=jax_mesh)
        assert e.value.code == "invalid_argument" and e.value.details["target"] == [
            "float32", [16, 4]]
        # One process with one device restores the 4-process checkpoint whole.
        import jax_rank  # noqa: PLC0415 - tests/, beside this file
        target = jax_rank.nest({p: sds(shape, dtype, sharding=one)
                                for p, (shape, dtype) in jax_rank.SHAPES.items()},
                               {"step": 0, "note": ""})
        got = ckpt.restore(2, target, from_mesh=jax_mesh)
        want = jax_rank.global_values(2)
        for path in jax_rank.SHAPES:
            group, leaf = path.split("/")
            assert np.asarray(got[group][leaf]).tobytes() == want[path].tobytes(), path
        assert (got["step"], got["note"]) == (2, "seed 2")
        for bad in (np.zeros((16, 8), np.float32), sds((16, 8), np.float32), 3):
            with pytest.raises(tessera.TesseraError) as e:
                ckpt.restore(2, {"params": {"w": bad}}, from_mesh=jax_mesh)
            assert e.value.code == "invalid_argument" and \
                e.value.details["tensor"] == "['params']['w']", e.value
