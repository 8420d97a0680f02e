"""After close, a model still works and owns its memory; restore() without a step
agrees on one step across the mesh's workers (or returns None on a fresh start);
metadata() reads what a save stored, with the worker's credential only."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tessera
from eventually import eventually
from test_save_restore import each

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# Runs in a child process, so that a fault (SIGSEGV) is an exit status, not a dead pytest.
AFTER_CLOSE = textwrap.dedent("""
    import gc, io, sys
    import torch
    import tessera

    mesh, worker = sys.argv[1], sys.argv[2]

    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64),
                                   torch.nn.Linear(64, 8))

    def train(m, opt, steps):
        for s in range(steps):
            loss = m(torch.full((4, 64), float(s))).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    a = model(0)
    opt_a = torch.optim.Adam(a.parameters())
    with tessera.CheckpointManager(mesh, worker=worker) as ck:
        state = ck.attach_state_dict({"model": a, "optim": opt_a})
        view = ck.attach("plain", (1 << 16,), "float32", like="torch")  # an attach() view
        nview = ck.attach("plain-np", (1 << 16,), "float32")
        train(a, opt_a, 2)
    del ck
    gc.collect()

    # Every parameter, buffer and optimizer tensor reads and writes after close.
    with torch.no_grad():
        for name, t in state.items():
            before = t.clone()
            t.add_(1)
            assert torch.equal(t, before + 1), name
            t.sub_(1)
    train(a, opt_a, 2)                      # training goes on
    torch.save(a.state_dict(), io.BytesIO())  # and so does a final save by torch
    view.fill_(3)
    nview[:] = 4
    assert float(view.sum()) == 3 * (1 << 16) and float(nview.sum()) == 4 * (1 << 16)

    # A second model attached under the same names does not alias the first.
    b = model(1)
    with tessera.CheckpointManager(mesh, worker=worker) as ck:
        ck.attach_state_dict({"model": b, "optim": torch.optim.Adam(b.parameters())})
        for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
            assert pa.data_ptr() != pb.data_ptr(), name
            assert not torch.equal(pa, pb), name
        with torch.no_grad():
            before = [p.clone() for p in a.parameters()]
            for p in b.parameters():
                p.fill_(123)
            for p, q in zip(a.parameters(), before):
                assert torch.equal(p, q)
    print("after close: ok")
""")


def test_tensors_outlive_their_manager(cluster, client, mesh_name):
    client.register_mesh(mesh_name, {"data": 1}, workers=cluster.worker_ids[:1])
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run([sys.executable, "-c", AFTER_CLOSE, mesh_name, cluster.worker_urls[0]],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "after close: ok" in r.stdout


def attach4(ms):
    return each(ms, lambda rank, m: m.attach("w", (8,), "float32", ["data"]))


def test_restore_without_a_step_agrees_on_the_step_every_worker_saw(mesh4, cluster, client):
    mesh, ms = mesh4
    arrays = attach4(ms)
    for step in (1, 2):
        for a in arrays:
            a[:] = step
        for h in each(ms, lambda rank, m, s=step: m.save(s)):
            h.wait(timeout=30)

    # Three trainers ask first: their workers read step 2 as the latest, then wait
    # in the agreement for the fourth.
    with_three = []
    pool = [threading.Thread(target=lambda r=rank: with_three.append(
        (r, ms[r].restore(timeout=60)))) for rank in range(3)]
    for t in pool:
        t.start()
    health = [tessera._http.Endpoint(u, "worker", timeout=5) for u in cluster.worker_urls[:3]]
    eventually(lambda: all(h.json("GET", "/healthz")["collectives_in_flight"] == 1 for h in health),
               "the three restores never reached the agreement", interval=0.005)
    # Step 3 commits meanwhile (a REST save: the workers snapshot what they hold).
    for a in arrays:
        a[:] = 3
    client.save(mesh, 3).wait(timeout=30)
    assert ms[3].latest_step() == 3
    fourth = ms[3].restore(timeout=60)  # its own view is 3; the mesh agrees on 2
    for t in pool:
        t.join(60)
    assert fourth == 2 and sorted(with_three) == [(0, 2), (1, 2), (2, 2)]
    for a in arrays:
        np.testing.assert_array_equal(a, [2, 2])


def test_restore_without_a_step_on_a_fresh_mesh_returns_none(mesh4):
    mesh, ms = mesh4
    attach4(ms)
    assert each(ms, lambda rank, m: m.restore()) == [None] * 4


def test_a_lone_restore_without_a_step_names_the_workers_that_did_not_come(mesh4, cluster):
    mesh, ms = mesh4
    attach4(ms)
    for h in each(ms, lambda rank, m: m.save(1)):
        h.wait(timeout=30)
    with pytest.raises(tessera.TesseraError) as e:
        ms[0].restore(timeout=1)
    err = e.value
    assert err.code == "deadline_exceeded", repr(err)
    assert set(err.details["missing_workers"]) == set(cluster.worker_ids[1:])
    assert "every trainer of the mesh" in str(err)
    assert ms[0].restore(1) == 1  # a step named restores alone


def test_metadata_through_the_worker_credential(mesh4, monkeypatch):
    mesh, ms = mesh4
    attach4(ms)
    monkeypatch.delenv("TESSERA_TOKEN", raising=False)
    for h in each(ms, lambda rank, m: m.save(5, metadata={"iter": 5, "config": {"lr": 0.1}})):
        h.wait(timeout=30)
    assert ms[2].metadata(5) == {"iter": 5, "config": {"lr": 0.1}}
    assert ms[1].metadata() == ms[2].metadata(5)  # the latest
    record = ms[0].checkpoint(5)
    assert record["state"] == "committed" and [t["name"] for t in record["tensors"]] == ["w"]
    restored = each(ms, lambda rank, m: m.restore())
    assert restored == [5] * 4 and restored[3].metadata == {"iter": 5, "config": {"lr": 0.1}}
    with pytest.raises(tessera.TesseraError) as e:
        ms[0].metadata(6)
    assert e.value.code == "not_found" and e.value.details["step"] == 6
