"""Bad input: every case raises TesseraError naming the culprit, quickly."""

import socket

import time

import pytest

import tessera


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def setup(cluster, client, mesh_name):
    """Mesh {data: 4} with tensor w [8, 2] attached everywhere, a step-1 checkpoint,
    a step-2 save that one trainer never joins (not committed), and a mesh of
    worker 0 only."""
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    client.register_mesh(mesh_name + ".solo", {"data": 1}, workers=cluster.worker_ids[:1])
    ms = [tessera.CheckpointManager(mesh_name, worker=u, timeout=10) for u in cluster.worker_urls]
    for m in ms:
        m.attach("w", (8, 2), "float32", ["data", None])
    for h in [m.save(1) for m in ms]:
        h.wait(timeout=30)
    for m in ms[:3]:
        m.save(2)
    # Each of the three writes its share and joins: the save shows once a join is in.
    deadline = time.monotonic() + 30
    while True:
        try:
            pending = client.checkpoint(mesh_name, 2)["job"]
            break
        except tessera.TesseraError as e:
            if e.code != "not_found" or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    yield mesh_name, ms
    client.cancel_job(pending)
    for m in ms:
        m.close()


def case(fn, code, status, **details):
    return fn, code, status, details


CASES = {
    "worker-not-running": case(
        lambda c, mesh, ms: tessera.CheckpointManager(
            mesh, worker="http://127.0.0.1:%d" % c.dead_port),
        "unavailable", 0),
    "no-worker-given": case(
        lambda c, mesh, ms: tessera.CheckpointManager(mesh), "invalid_argument", 0,
        field="worker"),
    "worker-url-not-http": case(
        lambda c, mesh, ms: tessera.CheckpointManager(mesh, worker="ftp://x:1"),
        "invalid_argument", 0, field="worker"),
    "mesh-does-not-exist": case(
        lambda c, mesh, ms: tessera.CheckpointManager("no-such-mesh", worker=c.worker_urls[0]),
        "not_found", 404, mesh="no-such-mesh"),
    "worker-not-in-mesh": case(
        lambda c, mesh, ms: tessera.CheckpointManager(mesh + ".solo", worker=c.worker_urls[2]),
        "conflict", 409, mesh=lambda mesh: mesh + ".solo"),
    "bad-mesh-name": case(
        lambda c, mesh, ms: tessera.CheckpointManager("bad mesh", worker=c.worker_urls[0]),
        "invalid_argument", 400, field="mesh"),
    "attached-twice-other-shape": case(
        lambda c, mesh, ms: ms[0].attach("w", (16, 2), "float32", ["data", None]),
        "conflict", 409, tensor="w", mesh=None),
    "attached-twice-other-dtype": case(
        lambda c, mesh, ms: ms[0].attach("w", (8, 2), "int64", ["data", None]),
        "conflict", 409, tensor="w"),
    "shape-not-divisible": case(
        lambda c, mesh, ms: ms[0].attach("v", (6, 2), "float32", ["data", None]),
        "invalid_argument", 400, tensor="v", field="layout"),
    "layout-too-short": case(
        lambda c, mesh, ms: ms[0].attach("v", (8, 2), "float32", ["data"]),
        "invalid_argument", 400, field="layout", tensor="v"),
    "layout-unknown-axis": case(
        lambda c, mesh, ms: ms[0].attach("v", (8, 2), "float32", ["model", None]),
        "invalid_argument", 400, tensor="v"),
    "unknown-dtype": case(
        lambda c, mesh, ms: ms[0].attach("v", (8,), "complex64"), "invalid_argument", 0,
        field="dtype"),
    "bad-tensor-name": case(
        lambda c, mesh, ms: ms[0].attach("../etc", (8,), "float32"), "invalid_argument", 400,
        field="name"),
    "device-not-on-worker": case(
        lambda c, mesh, ms: ms[0].attach("v", (8,), "float32", device=3), "invalid_argument",
        400, device=3, tensor="v"),
    "step-not-committed": case(
        lambda c, mesh, ms: ms[0].restore(2), "conflict", 409, step=2),
    "step-unknown": case(
        lambda c, mesh, ms: ms[0].restore(999), "not_found", 404, step=999),
    "save-negative-step": case(
        lambda c, mesh, ms: ms[0].save(-3), "invalid_argument", 0, field="step"),
    "save-unknown-tensor": case(
        lambda c, mesh, ms: ms[0].save(3, tensors=["nope"]), None, None, tensor="nope"),
    "save-step-committed": case(
        lambda c, mesh, ms: ms[0].save(1).wait(timeout=10), "conflict", 409, step=1),
    "wait-unknown-save": case(
        lambda c, mesh, ms: ms[0]._save_status(77, "committed", 1), "not_found", 404, step=77),
    "collective-nobody-else-comes": case(
        lambda c, mesh, ms: ms[0].all_reduce(__import__("numpy").ones(4, "float32"),
                                             timeout_ms=300),
        "deadline_exceeded", 504),
    "collective-bad-reduce": case(
        lambda c, mesh, ms: ms[0].all_reduce(__import__("numpy").ones(4, "float32"),
                                             reduce="median"),
        "invalid_argument", 400),
    "read-unknown-tensor": case(
        lambda c, mesh, ms: ms[1].read("nope"), "not_found", 404, tensor="nope"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, cluster, setup, monkeypatch):
    mesh, ms = setup
    monkeypatch.delenv("TESSERA_WORKER", raising=False)
    cluster.dead_port = free_port()
    fn, code, status, details = CASES[name]
    with pytest.raises(tessera.TesseraError) as e:
        fn(cluster, mesh, ms)
    err = e.value
    if code is not None:
        assert err.code == code, repr(err)
    if status is not None:
        assert err.status == status, repr(err)
    for key, value in details.items():
        assert key in err.details, repr(err)
        if callable(value):
            value = value(mesh)
        if value is not None:
            assert err.details[key] == value, repr(err)
    assert str(err) and err.message
    if name == "worker-not-running":
        assert ("127.0.0.1:%d" % cluster.dead_port) in str(err)
        assert err.details["endpoint"] == "http://127.0.0.1:%d" % cluster.dead_port


def test_a_wrong_local_credential_is_refused_naming_it(cluster, tmp_path):
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-credential")
    with pytest.raises(tessera.TesseraError) as e:
        tessera.CheckpointManager("any", worker=cluster.worker_urls[0], credential_file=str(wrong))
    assert e.value.code == "unauthenticated" and e.value.status == 401
    assert "local credential" in e.value.message
    with pytest.raises(tessera.TesseraError) as e:
        tessera.CheckpointManager("any", worker=cluster.worker_urls[0],
                                  credential_file=str(tmp_path / "missing.key"))
    assert e.value.code == "not_found" and e.value.details["file"].endswith("missing.key")
