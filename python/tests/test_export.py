"""Export: a committed checkpoint as Hugging Face safetensors files, by `tessera export`
and by a REST export job on the mesh's workers, read back here by a reader of the
tests' own (safetensors_files.py)."""

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tessera.local import find_bin_dir
from safetensors_files import read_safetensors

def export(cluster, mesh, step, out, *extra):
    cli = os.path.join(find_bin_dir(None), "tessera")
    ckpt = os.path.join(cluster.dir, "data", "checkpoints", mesh, "step-%d" % step)
    return subprocess.run([cli, "export", ckpt, str(out)] + list(extra), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def saved(mesh4):
    """Step 7 of a {data: 4} mesh with tensors of several dtypes and layouts; the
    global arrays it holds."""
    import torch
    mesh, ms = mesh4
    want = {
        "layer/w": np.arange(32 * 3, dtype=np.float32).reshape(32, 3) / 7,   # sharded over data
        "layer/b": np.array([1.5, -2.0, 3.25], dtype=np.float32),           # replicated
        "ids": np.array([1, 2, 3, 2 ** 40], dtype=np.int64),
        "half": (np.arange(8, dtype=np.float16) - 3).reshape(8, 1),        # sharded
        "mask": np.array([True, False, True]),
        "bytes": np.arange(5, dtype=np.uint8),
    }
    bf = torch.tensor([1.0, -0.5, 3.0], dtype=torch.bfloat16)

    def fill(rank, m):
        w = m.attach("layer/w", (32, 3), "float32", ["data", None])
        w[:] = want["layer/w"][rank * 8:(rank + 1) * 8]
        m.attach("layer/b", (3,), "float32")[:] = want["layer/b"]
        m.attach("ids", (4,), "int64")[:] = want["ids"]
        m.attach("half", (8, 1), "float16", ["data", None])[:] = want["half"][rank * 2:(rank + 1) * 2]
        m.attach("mask", (3,), "bool")[:] = want["mask"]
        m.attach("bytes", (5,), "uint8")[:] = want["bytes"]
        m.attach("bf", (3,), "bfloat16", like="torch").copy_(bf)
        return m.save(7, metadata={"epoch": 2})

    with ThreadPoolExecutor(4) as pool:
        handles = list(pool.map(lambda rm: fill(*rm), enumerate(ms)))
    for h in handles:
        assert h.wait(timeout=60)["state"] == "committed"
    want["bf"] = bf.view(torch.int16).numpy().view(np.uint16)
    return mesh, want


def test_one_file_holds_every_tensor_with_its_values(cluster, saved, tmp_path):
    mesh, want = saved
    r = export(cluster, mesh, 7, tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors", "model.safetensors.index.json"]
    got, meta = read_safetensors(tmp_path / "model.safetensors")
    assert set(got) == set(want)
    types = {"layer/w": "F32", "layer/b": "F32", "ids": "I64", "half": "F16", "mask": "BOOL",
             "bytes": "U8", "bf": "BF16"}
    for name, arr in want.items():
        dtype, value = got[name]
        assert dtype == types[name], name
        assert value.shape == arr.shape and np.array_equal(value, arr), name
    assert json.loads(meta["tessera.step"]) == 7 and json.loads(meta["tessera.metadata"]) == {"epoch": 2}
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {n: "model.safetensors" for n in want}
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in want.values())


def test_small_files_hold_each_tensor_whole_in_exactly_one(cluster, saved, tmp_path):
    mesh, want = saved
    # 24-byte blocks: the 384-byte layer/w goes in many reads, each while the one
    # before is written.
    r = export(cluster, mesh, 7, tmp_path, "--max-file-size", "64", "--block-size", "24")
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert len(files) > 1 and all(f.startswith("model-") for f in files), files
    seen = {}
    for f in files:
        got, _ = read_safetensors(tmp_path / f)
        size = sum(v.nbytes for _, v in got.values())
        assert size <= 64 or len(got) == 1, (f, size)  # over the limit only alone
        for name, (_, value) in got.items():
            assert name not in seen, name
            seen[name] = f
            assert np.array_equal(value, want[name]), name
    assert seen == index["weight_map"]


def test_a_step_that_is_not_committed_is_named(cluster, saved, tmp_path):
    mesh, _ = saved
    r = export(cluster, mesh, 8, tmp_path)
    assert r.returncode == 1
    assert "step-8" in r.stderr and "index.sqlite" in r.stderr, r.stderr


def test_a_rest_export_job_spreads_the_files_over_the_workers(cluster, client, saved, tmp_path):
    mesh, want = saved
    out = tmp_path / "hf"
    job = client.export(mesh, 7, out).wait(timeout=60)
    assert job["state"] == "succeeded", job
    result = job["result"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    # 7 tensors over 4 workers: at least a file per worker, each tensor in one file.
    assert len(files) == 4 and sorted(result["files"]) == files, (files, result)
    assert sorted(index["weight_map"]) == sorted(want)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in want.values()) == result["bytes"]
    for f in files:
        got, meta = read_safetensors(out / f)
        assert json.loads(meta["tessera.step"]) == 7
        for name, (_, value) in got.items():
            assert index["weight_map"][name] == f
            assert np.array_equal(value, want[name]), name


def test_a_rest_export_names_what_is_wrong(client, saved, tmp_path):
    mesh, _ = saved
    from tessera.errors import TesseraError
    with pytest.raises(TesseraError) as e:
        client.export(mesh, 7, "relative/dir")
    assert e.value.code == "invalid_argument" and e.value.details["field"] == "dir"
    with pytest.raises(TesseraError) as e:
        client.export(mesh, 8, tmp_path)
    assert e.value.code == "not_found"
    # A folder nobody may write: the job fails naming the file it could not write.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(TesseraError) as e:
        client.export(mesh, 7, blocked).wait(timeout=60)
    assert str(blocked) in str(e.value) and "worker w-host" in str(e.value), e.value
    assert not os.path.exists(blocked / "model.safetensors.index.json")


def test_uncompressed_shards_export_from_their_mapping_and_a_bad_chunk_is_named(cluster, client, mesh4,
                                                                                tmp_path):
    """Raw chunks go straight from the mapped shards (one copy), still checksummed."""
    mesh, ms = mesh4
    for rank, m in enumerate(ms):
        m.attach("rows", (4 * 1024,), "float32", ["data"])[:] = np.arange(1024, dtype=np.float32) + rank * 1024
    assert client.save(mesh, 3, compression="none").wait(timeout=60)["state"] == "succeeded"
    r = export(cluster, mesh, 3, tmp_path / "ok")
    assert r.returncode == 0, r.stderr
    got, _ = read_safetensors(tmp_path / "ok" / "model.safetensors")
    assert np.array_equal(got["rows"][1], np.arange(4 * 1024, dtype=np.float32))
    # One flipped byte inside rank 2's rows: both exports name the shard and tensor.
    ckpt = os.path.join(cluster.dir, "data", "checkpoints", mesh, "step-3")
    # Each rank's shard file is shard-<rank>-<tag>.tsr.
    name = next(n for n in os.listdir(ckpt) if n.startswith("shard-2-") and n.endswith(".tsr"))
    shard = os.path.join(ckpt, name)
    data = bytearray(open(shard, "rb").read())
    at = data.find(np.array([2048 + 5], dtype=np.float32).tobytes())
    assert at > 0
    data[at] ^= 0x40
    open(shard, "wb").write(bytes(data))
    r = export(cluster, mesh, 3, tmp_path / "bad")
    assert r.returncode == 1 and "data_loss" in r.stderr and "checksum mismatch" in r.stderr, r.stderr
    assert name in r.stderr and "'rows'" in r.stderr, r.stderr
    from tessera.errors import TesseraError
    with pytest.raises(TesseraError) as e:
        client.export(mesh, 3, tmp_path / "bad-job").wait(timeout=60)
    assert e.value.code == "data_loss" and name in str(e.value), e.value
