"""Incremental saves from a training loop (docs/semantics.md, "Incremental checkpoints"):
a save writes only what changed since the last committed one, restores see whole
checkpoints, and deleting the one whose files later saves use keeps those files."""

import glob
import os

import numpy as np
from eventually import eventually
from safetensors_files import read_safetensors
from test_save_restore import each


def attach(ms):
    """A frozen base (never changes after the first save) and a trained layer."""
    def one(rank, m):
        base = m.attach("base", (64, 256), "float32", ["data", None])
        head = m.attach("head", (8, 16), "float32", ["data", None])
        base[:] = rank + 0.5
        head[:] = 0
        return base, head
    return each(ms, one)


def train(arrays, value):
    for rank, (_, head) in enumerate(arrays):
        head[:] = value + rank


def save(ms, step, **options):
    handles = each(ms, lambda rank, m: m.save(step, **options))
    for h in handles:
        assert h.wait(timeout=30)["state"] == "committed"


def step_dir(cluster, mesh, step):
    found = glob.glob(os.path.join(cluster.dir, "**", mesh, "step-%d" % step), recursive=True)
    assert len(found) == 1, found
    return found[0]


def test_a_save_writes_what_changed_and_restores_whole(cluster, client, mesh4):
    mesh, ms = mesh4
    arrays = attach(ms)
    save(ms, 1)
    first = client.checkpoint(mesh, 1)
    assert first["referenced_bytes"] == 0
    train(arrays, 1.0)
    save(ms, 2)
    second = client.checkpoint(mesh, 2)
    base_bytes = next(t["stored_bytes"] for t in first["tensors"] if t["name"] == "base")
    # The frozen base is not written again: its chunks are step 1's.
    assert second["referenced_bytes"] >= base_bytes > 0
    assert client.verify(mesh, 2).wait(timeout=30)["result"]["ok"]

    train(arrays, 7.0)
    assert each(ms, lambda rank, m: m.restore(2)) == [2] * 4
    for rank, (base, head) in enumerate(arrays):
        assert (base == rank + 0.5).all() and (head == 1.0 + rank).all()

    # Step 1 goes; step 2 keeps the files it uses, and only those.
    client.delete_checkpoint(mesh, 1)
    assert [c["step"] for c in client.checkpoints(mesh)] == [2]
    client.collect_garbage()
    kept = sorted(os.listdir(step_dir(cluster, mesh, 1)))
    assert "index.sqlite" not in kept and "retired" in kept and len(kept) > 1
    train(arrays, 3.0)
    assert each(ms, lambda rank, m: m.restore(2)) == [2] * 4
    assert all((head == 1.0 + rank).all() for rank, (_, head) in enumerate(arrays))
    assert client.verify(mesh, 2).wait(timeout=30)["result"]["ok"]
    # An export reads it whole too, its base's chunks from the retired dir.
    out = os.path.join(cluster.dir, "export-%s" % mesh)
    assert client.export(mesh, 2, out).wait(timeout=60)["state"] == "succeeded"
    tensors = {}
    for f in glob.glob(os.path.join(out, "*.safetensors")):
        tensors.update(read_safetensors(f)[0])
    want_base = np.concatenate([np.full((16, 256), r + 0.5, np.float32) for r in range(4)])
    want_head = np.concatenate([np.full((2, 16), 1.0 + r, np.float32) for r in range(4)])
    assert (tensors["base"][1] == want_base).all() and (tensors["head"][1] == want_head).all()

    # A full save refers to nothing; once step 2 goes too, step 1's files go.
    save(ms, 3, full=True)
    assert client.checkpoint(mesh, 3)["referenced_bytes"] == 0
    client.delete_checkpoint(mesh, 2)
    assert not glob.glob(os.path.join(cluster.dir, "**", mesh, "step-1"), recursive=True)


def test_every_full_every_th_save_writes_every_chunk(client, mesh4):
    mesh, ms = mesh4
    arrays = attach(ms)
    for step in range(1, 6):
        train(arrays, float(step))
        save(ms, step, full_every=2)
    referenced = [client.checkpoint(mesh, s)["referenced_bytes"] > 0 for s in range(1, 6)]
    assert referenced == [False, True, False, True, False]


def test_back_to_back_saves_with_keep_last_1_all_commit(client, mesh4):
    """A save taken before its workers heard that the one before committed builds on the
    one before that; retention keeps that base while the save is in flight, so no save
    fails for a base retention took (docs/semantics.md, S9)."""
    mesh, ms = mesh4
    arrays = attach(ms)
    client.set_retention(mesh, keep_last=1)
    handles, ends = [], []
    for step in range(1, 25):
        train(arrays, float(step))
        handles.append(each(ms, lambda rank, m: m.save(step)))  # not waited for
        if len(handles) > 2:  # two saves in flight (a worker takes 4 at most)
            ends.append([h.wait(timeout=60) for h in handles.pop(0)])
    ends += [[h.wait(timeout=60) for h in hs] for hs in handles]
    failed = [(step + 1, e) for step, es in enumerate(ends) for e in es if e["state"] != "committed"]
    assert not failed, failed
    listed = client.checkpoints(mesh)
    assert [c["step"] for c in listed][0] == 24
    # What a retention kept for saves in flight goes by the next one's: one more save. A
    # trainer hears of its commit before its retention, which then follows.
    train(arrays, 25.0)
    save(ms, 25)
    eventually(lambda: [c["step"] for c in client.checkpoints(mesh)] == [25],
               what="retention after step 25 keeps it alone")
    train(arrays, 0.0)
    assert each(ms, lambda rank, m: m.restore()) == [25] * 4
    for rank, (base, head) in enumerate(arrays):
        assert (base == rank + 0.5).all() and (head == 25.0 + rank).all()
    assert client.verify(mesh, 25).wait(timeout=30)["result"]["ok"]
