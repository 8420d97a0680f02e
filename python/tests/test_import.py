"""Import: safetensors files (one file, or a Hugging Face model folder with its index)
as a committed checkpoint, by `tessera import` and by a REST import job on the mesh's
workers, restored sharded into the trainers. The files are written by the tests' own
writer (safetensors_files.py); bad files are named, never committed."""

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from safetensors_files import read_safetensors, write_model_folder, write_safetensors
from tessera.errors import TesseraError
from tessera.local import find_bin_dir


def cli(*args):
    return subprocess.run([os.path.join(find_bin_dir(None), "tessera")] + [str(a) for a in args],
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def each(ms, fn):
    with ThreadPoolExecutor(len(ms)) as pool:
        return list(pool.map(lambda rm: fn(*rm), enumerate(ms)))


def model():
    """Two shards of a small model: several dtypes, a scalar, BF16 as its bits."""
    return [
        {"model.embed.weight": np.arange(32 * 3, dtype=np.float32).reshape(32, 3) / 7,
         "model.layers.0.bias": np.array([1.5, -2.0, 3.25], dtype=np.float32),
         "ids": np.array([1, 2, 3, 2 ** 40], dtype=np.int64)},
        {"half": (np.arange(8, dtype=np.float16) - 3).reshape(8, 1),
         "mask": np.array([True, False, True]),
         "scale": np.array(0.5, dtype=np.float64),
         "bf": ("BF16", np.array([0x3F80, 0xBF00, 0x4040], dtype=np.uint16))},
    ]


def flat(shards):
    return {k: (v[1] if isinstance(v, tuple) else v) for s in shards for k, v in s.items()}


def test_a_model_folder_imports_and_restores_sharded_into_the_trainers(client, mesh4, tmp_path):
    mesh, ms = mesh4
    shards = model()
    write_model_folder(tmp_path / "hf", shards, metadata={"format": "pt"})
    job = client.import_safetensors(mesh, tmp_path / "hf", 5, metadata={"source": "hf"}).wait(timeout=60)
    assert job["state"] == "succeeded", job
    record = client.checkpoint(mesh, 5)
    assert record["state"] == "committed" and record["metadata"]["source"] == "hf"
    assert record["metadata"]["imported_from"] == str(tmp_path / "hf")
    assert sorted(t["name"] for t in record["tensors"]) == sorted(flat(shards))
    want = flat(shards)

    def restore(rank, m):
        w = m.attach("model.embed.weight", (32, 3), "float32", ["data", None])  # sharded 4 ways
        half = m.attach("half", (8, 1), "float16", ["data", None])
        rest = {n: m.attach(n, a.shape, str(a.dtype)) for n, a in want.items()
                if n not in ("model.embed.weight", "half", "bf")}
        bf = m.attach("bf", (3,), "bfloat16", like="torch")
        assert m.restore(5) == 5
        return w.copy(), half.copy(), {n: a.copy() for n, a in rest.items()}, bf.view(__import__("torch").int16).numpy().copy()

    got = each(ms, restore)
    for rank, (w, half, rest, bf) in enumerate(got):
        assert np.array_equal(w, want["model.embed.weight"][rank * 8:(rank + 1) * 8])
        assert np.array_equal(half, want["half"][rank * 2:(rank + 1) * 2])
        for n, a in rest.items():
            assert np.array_equal(a, want[n]), n
        assert np.array_equal(bf.view(np.uint16), want["bf"])


def test_a_restore_checks_names_dtypes_and_shapes_against_the_imported_tensors(client, mesh4, tmp_path):
    mesh, ms = mesh4
    write_safetensors(tmp_path / "one.safetensors", {"w": np.ones((8, 2), dtype=np.float32)})
    assert client.import_safetensors(mesh, tmp_path / "one.safetensors", 3).wait(timeout=60)["state"] == "succeeded"

    def restore(rank, m):
        m.attach("w", (8, 2), "float64", ["data", None])
        with pytest.raises(TesseraError) as e:
            m.restore(3)
        return e.value

    for err in each(ms, restore):
        assert "'w'" in str(err) and "float64" in str(err) and "float32" in str(err), err


def test_tessera_import_then_export_gives_back_the_same_tensors(tmp_path):
    shards = model()
    write_model_folder(tmp_path / "hf", shards)
    r = cli("import", tmp_path / "hf", tmp_path / "root", "--mesh", "llm", "--step", "9")
    assert r.returncode == 0, r.stderr
    assert "imported 7 tensors" in r.stdout and "2 files" in r.stdout, r.stdout
    assert cli("verify", tmp_path / "root" / "llm" / "step-9").returncode == 0
    ls = cli("ls", tmp_path / "root", "--json")
    assert ls.returncode == 0 and "llm" in ls.stdout, ls
    r = cli("export", tmp_path / "root" / "llm" / "step-9", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    got, _ = read_safetensors(tmp_path / "out" / "model.safetensors")
    want = flat(shards)
    assert sorted(got) == sorted(want)
    for name, (_, value) in got.items():
        assert value.shape == want[name].shape and np.array_equal(value, want[name]), name
    # The same step again is a conflict; the committed one is untouched.
    r = cli("import", tmp_path / "hf", tmp_path / "root", "--mesh", "llm", "--step", "9")
    assert r.returncode == 1 and "conflict" in r.stderr and "step 9" in r.stderr, r.stderr
    assert cli("verify", tmp_path / "root" / "llm" / "step-9").returncode == 0


def bad_files(d):
    """(file, the tensor named or None, the code, a phrase of the message) per bad file."""
    ok = np.zeros(4, dtype=np.float32)
    cases = []

    def add(name, tensor, code, phrase, **kw):
        path = d / (name + ".safetensors")
        write_safetensors(path, kw.pop("tensors", {"a": ok}), **kw)
        cases.append((path, tensor, code, phrase))

    add("past-end", None, "data_loss", "past the end", header_size=1 << 20)
    add("huge-header", None, "invalid_argument", "over the limit", header_size=(100 << 20) + 8)
    add("unknown-dtype", "a", "invalid_argument", "dtype U32", tensors={"a": ("U32", ok.view(np.uint32))})
    # Offsets that overlap, and offsets past the file: the header edited by hand.
    for name, tensor, offsets, phrase in (("overlap", "b", [[0, 16], [8, 24]], "overlap"),
                                          ("out-of-file", "a", [[0, 64]], "run out of the file")):
        header = {k: {"dtype": "F32", "shape": [(o[1] - o[0]) // 4], "data_offsets": o}
                  for k, o in zip("ab", offsets)}
        text = json.dumps(header).encode()
        path = d / (name + ".safetensors")
        path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(24))
        cases.append((path, tensor, "data_loss", phrase))
    return cases


def test_bad_files_are_named_by_the_cli_and_nothing_is_committed(tmp_path):
    for path, tensor, code, phrase in bad_files(tmp_path):
        r = cli("import", path, tmp_path / "root", "--mesh", "m", "--step", "1")
        assert r.returncode == 1, (path, r.stdout)
        assert code in r.stderr and str(path) in r.stderr and phrase in r.stderr, r.stderr
        if tensor:
            assert "tensor '%s'" % tensor in r.stderr, r.stderr
        assert not (tmp_path / "root" / "m" / "step-1").exists()


def test_bad_files_fail_the_import_job_naming_them_and_the_step_stays_free(client, mesh4, tmp_path):
    mesh, _ = mesh4
    for path, tensor, code, phrase in bad_files(tmp_path):
        with pytest.raises(TesseraError) as e:
            client.import_safetensors(mesh, path, 1).wait(timeout=60)
        assert e.value.code == code and str(path) in str(e.value) and phrase in str(e.value), e.value
        if tensor:
            assert e.value.details.get("tensor") == tensor, e.value.details
        assert client.checkpoint(mesh, 1)["state"] == "failed"
    # A missing source, a relative one, and a folder without safetensors files.
    for source, code in ((tmp_path / "nothing", "not_found"), ("relative", "invalid_argument")):
        with pytest.raises(TesseraError) as e:
            client.import_safetensors(mesh, source, 1).wait(timeout=60)
        assert e.value.code == code, e.value
    # The step is free for a good import.
    write_safetensors(tmp_path / "good.safetensors", {"a": np.arange(4, dtype=np.float32)})
    assert client.import_safetensors(mesh, tmp_path / "good.safetensors", 1).wait(timeout=60)["state"] == "succeeded"
