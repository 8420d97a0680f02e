"""tessera.dcp: PyTorch Distributed Checkpoint's save, async_save (both modes) and load
through Tessera, with 4 real ranks (gloo) each talking to its own worker
(tests/dcp_rank.py), and the checkpoint seen from the other clients."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tessera
from tessera.local import LocalCluster
from tessera import dcp as tdcp
from tessera import _dcp_layout as layout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from conftest import free_port  # noqa: E402
from eventually import eventually  # noqa: E402


def run_ranks(cluster, mesh, mode, step, what="both", world=4, timeout=300, env=None, dies=None):
    """Runs `world` ranks (tests/dcp_rank.py); what each printed last. `dies`: a rank
    killed mid-save (its exit status is not checked, and it prints nothing)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."), **(env or {}))
    if dies is not None:
        env["DCP_DIE_RANK"] = str(dies)
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "dcp_rank.py"), str(r), str(world), str(port), mesh,
         cluster.worker_urls[r], mode, str(step), what],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in range(world)]
    seen = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=timeout)
        if r == dies:
            seen.append(None)
            continue
        assert p.returncode == 0, "rank %d: %s\n%s" % (r, out, err[-4000:])
        seen.append(json.loads(out.strip().splitlines()[-1]))
    return seen


@pytest.fixture
def rank_mesh(cluster, client, mesh_name):
    client.register_mesh(mesh_name, {"rank": 4}, workers=cluster.worker_ids)
    return mesh_name


@pytest.mark.parametrize("mode", ["sync", "thread", "process"])
def test_save_and_load_bit_for_bit(cluster, client, rank_mesh, mode):
    seen = run_ranks(cluster, rank_mesh, mode, step=3)
    assert all(s.get("same") for s in seen), seen
    assert all(s["restored_step"] == 3 for s in seen), seen
    # One Tessera checkpoint like any other: listed and committed.
    record = client.checkpoint(rank_mesh, 3)
    assert record["state"] == "committed"
    names = {t["name"]: t for t in record["tensors"]}
    # Even shards and whole replicas are named tensors; the rest is packed.
    assert names["model.w"]["layout"] == ["rank", "unsharded"]
    assert names["model.c"]["layout"] == ["unsharded", "rank"]
    assert names["model.bias"]["layout"] == ["unsharded"]
    assert names["model.r"]["layout"] == ["unsharded"]
    assert names["model.half"]["dtype"] == "bfloat16"
    assert layout.PACKED in names  # model.u: 10 rows over 4 ranks
    assert "model.u" not in names


def test_an_fsdp2_model_and_its_optimizer_come_back_bit_for_bit(cluster, client, rank_mesh):
    seen = run_ranks(cluster, rank_mesh, "fsdp", step=8)
    assert all(s.get("same") for s in seen), seen
    names = {t["name"]: t for t in client.checkpoint(rank_mesh, 8)["tensors"]}
    assert names["model.0.weight"]["layout"] == ["rank", "unsharded"], names.keys()


def test_a_load_onto_two_ranks_reshards(cluster, client, rank_mesh):
    run_ranks(cluster, rank_mesh, "sync", step=4, what="save")
    seen = run_ranks(cluster, rank_mesh, "sync", step=4, what="load", world=2)
    assert all(s.get("same") for s in seen), seen
    assert all(s["restored_step"] is None for s in seen), "read through the worker, not restored"


def test_a_checkpoint_restores_through_checkpoint_manager(cluster, client, rank_mesh, tmp_path):
    run_ranks(cluster, rank_mesh, "sync", step=5, what="save")
    # Verified and exported like any other checkpoint.
    assert client.verify(rank_mesh, 5).wait(60)["state"] == "succeeded"
    client.export(rank_mesh, 5, str(tmp_path)).wait(60)
    from safetensors.torch import load_file  # noqa: PLC0415 - bfloat16 too
    exported = {}
    for name in os.listdir(tmp_path):
        if name.endswith(".safetensors"):
            exported.update(load_file(str(tmp_path / name)))
    g = torch.Generator().manual_seed(5)
    assert torch.equal(exported["model.w"], torch.randn(16, 8, generator=g))
    assert exported["model.half"].dtype == torch.bfloat16
    ms = [tessera.CheckpointManager(rank_mesh, worker=cluster.worker_urls[r], timeout=30)
          for r in range(4)]
    try:
        views = [m.attach("model.w", (16, 8), "float32", layout=["rank", None]) for m in ms]
        for m in ms:
            assert m.restore(5, tensors=["model.w"]) == 5
        g = torch.Generator().manual_seed(5)
        expected = torch.randn(16, 8, generator=g).numpy()
        np.testing.assert_array_equal(np.concatenate(views), expected)
    finally:
        for m in ms:
            m.close()


def test_a_load_of_a_checkpoint_not_saved_through_dcp_names_it(cluster, client, rank_mesh):
    ms = [tessera.CheckpointManager(rank_mesh, worker=cluster.worker_urls[r], timeout=30)
          for r in range(4)]
    try:
        for m in ms:
            m.attach("plain", (4,), "float32", layout=["rank"])
        handles = [m.save(9) for m in ms]
        for h in handles:
            h.wait(60)
        reader = tdcp.Reader(mesh=rank_mesh, step=9, worker=cluster.worker_urls[0])
        with pytest.raises(tessera.TesseraError) as e:
            reader.read_metadata()
        assert "not saved through tessera.dcp" in str(e.value)
    finally:
        for m in ms:
            m.close()


def test_tensor_names_are_valid_and_distinct():
    fqns = ["model.w", "a b", "a-20b", "optim.state.0.exp_avg", "x/y", "..", "é", ""]
    names = [layout.tensor_name(f) for f in fqns]
    assert len(set(names)) == len(names)
    for n in names:
        assert "/" not in n and not n.startswith(".")


def test_bad_writer_arguments_are_refused():
    with pytest.raises(tessera.TesseraError):
        tdcp.Writer(mesh="m", step=-1)
    with pytest.raises(TypeError):
        tdcp.Writer(mesh="m", step=1, replicas=2, bogus=1)


def test_saves_from_one_process_follow_a_changed_placement(cluster, client, rank_mesh):
    # The second save copies where the first placed its chunks while the ranks agree, then
    # again where the new placement puts them; the third goes back.
    seen = run_ranks(cluster, rank_mesh, "twice", step=20, what="save")
    assert all(s.get("same") for s in seen), seen


def test_a_save_without_collectives(cluster, client, rank_mesh):
    seen = run_ranks(cluster, rank_mesh, "nocoll", step=10)
    assert all(s.get("same") for s in seen), seen


def test_a_load_of_a_key_the_checkpoint_lacks_names_it(cluster, client, rank_mesh):
    run_ranks(cluster, rank_mesh, "sync", step=6, what="save")
    seen = run_ranks(cluster, rank_mesh, "sync", step=6, what="load_extra")
    for s in seen:
        assert "model.not_saved" in s.get("error", ""), s


def test_the_memory_tier_through_the_writer(cluster, client, rank_mesh):
    env = {"DCP_WRITER_ARGS": json.dumps({"tier": "memory", "replicas": 1, "keep": 2, "force": True})}
    seen = run_ranks(cluster, rank_mesh, "sync", step=7, env=env)
    assert all(s.get("same") for s in seen), seen
    assert all(s["tier"] == "memory" for s in seen), seen


@pytest.fixture(scope="module")
def impatient():
    """A cluster whose in-loop saves give up on a missing trainer after 3 s."""
    c = LocalCluster(workers=4, heartbeat_ms=100, lease_ms=1500,
                     server_args=["--join-wait-ms", "3000"])
    yield c
    c.stop()


def test_a_rank_killed_mid_save_leaves_nothing_committed(impatient):
    client = impatient.client(timeout=30)
    mesh = "dcp-killed"
    client.register_mesh(mesh, {"rank": 4}, workers=impatient.worker_ids)
    run_ranks(impatient, mesh, "sync", step=1, what="save")
    seen = run_ranks(impatient, mesh, "sync", step=2, what="save", dies=2)
    # The others fail: DCP names the failure (the dead peer, or the save's error).
    for r in (0, 1, 3):
        assert "error" in seen[r], seen
    # The save of step 2 ends failed (the trainer of rank 2 never came); step 1 stays.
    def failed():
        listed = {c["step"]: c["state"] for c in client.checkpoints(mesh)}
        return listed.get(2, "failed") == "failed" and listed
    listed = eventually(failed, "the save of step 2 ended failed", timeout=60)
    assert [s for s, state in listed.items() if state == "committed"] == [1], listed
    # The next save commits, and loads.
    seen = run_ranks(impatient, mesh, "sync", step=3)
    assert all(s["same"] and s["restored_step"] == 3 for s in seen), seen


def test_the_worker_reads_boxes_and_names_a_bad_one(cluster, client, rank_mesh):
    ms = [tessera.CheckpointManager(rank_mesh, worker=cluster.worker_urls[r], timeout=30)
          for r in range(4)]
    try:
        for r, m in enumerate(ms):
            m.attach("t", (8, 2), "float32", layout=["rank", None])[:] = r
        for h in [m.save(30) for m in ms]:
            h.wait(60)
        reader = tdcp.Reader(mesh=rank_mesh, worker=cluster.worker_urls[0])
        path = "/v1/checkpoints/30/read?mesh=%s" % rank_mesh
        _, headers, data = reader.raw.call("POST", path, {"reads": [
            {"tensor": "t", "offsets": [3, 0], "lengths": [3, 2]},
            {"tensor": "t", "offsets": [7, 1], "lengths": [1, 1]}]})
        assert headers["X-Tessera-Step"] == "30"
        np.testing.assert_array_equal(np.frombuffer(data, dtype=np.float32),
                                      [1, 1, 2, 2, 2, 2, 3])
        with pytest.raises(tessera.TesseraError) as e:
            reader.raw.call("POST", path, {"reads": [{"tensor": "t", "offsets": [7, 0],
                                                      "lengths": [2, 2]}]})
        assert e.value.code == "invalid_argument" and e.value.details["tensor"] == "t"
        with pytest.raises(tessera.TesseraError) as e:
            reader.raw.call("POST", path, {"reads": [{"tensor": "nope", "offsets": [0],
                                                      "lengths": [1]}]})
        assert e.value.code == "not_found" and e.value.details["tensor"] == "nope"
    finally:
        for m in ms:
            m.close()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP's note on no_dist
def test_one_process_without_a_process_group(cluster, client, mesh_name):
    """no_dist=True: one rank and no torch.distributed, on a mesh of one worker: the
    rank is the whole world."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    client.register_mesh(mesh_name, {"rank": 1}, workers=cluster.worker_ids[:1])
    g = torch.Generator().manual_seed(3)
    sd = {"w": torch.randn(6, 4, generator=g), "h": torch.ones(3, dtype=torch.bfloat16),
          "meta": {"epoch": 2, "files": ["a"]}}
    writer = tdcp.Writer(mesh=mesh_name, step=1, worker=cluster.worker_urls[0])
    dcp.save(sd, storage_writer=writer, no_dist=True)
    target = {"w": torch.zeros(6, 4), "h": torch.zeros(3, dtype=torch.bfloat16),
              "meta": {"epoch": None, "files": None}}
    reader = tdcp.Reader(mesh=mesh_name, worker=cluster.worker_urls[0])
    dcp.load(target, storage_reader=reader, no_dist=True)
    assert torch.equal(target["w"], sd["w"]) and torch.equal(target["h"], sd["h"])
    assert target["meta"] == sd["meta"]
    assert int(reader.restored) == 1
