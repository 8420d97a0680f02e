"""tessera.Client against a real tesserad."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tessera


def test_cluster_and_workers(cluster, client):
    assert client.health()["status"] == "ok"
    assert client.cluster()["workers"]["alive"] >= 4
    ids = {w["id"] for w in client.workers()}
    assert set(cluster.worker_ids) <= ids
    w = client.worker(cluster.worker_ids[1])
    assert w["state"] == "alive" and w["local_api"] == cluster.worker_urls[1]


def test_register_mesh_is_idempotent_and_ordered(cluster, client, mesh_name):
    m = client.register_mesh(mesh_name, {"data": 2, "model": 2}, workers=cluster.worker_ids)
    assert [a["name"] for a in m["axes"]] == ["data", "model"]
    assert [d["worker"] for d in m["devices"]] == cluster.worker_ids
    again = client.register_mesh(mesh_name, {"data": 2, "model": 2}, workers=cluster.worker_ids)
    assert again["devices"] == m["devices"]
    assert mesh_name in {x["name"] for x in client.meshes()}
    assert client.mesh(mesh_name)["devices_per_worker"] == 1
    with pytest.raises(tessera.TesseraError) as e:
        client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    assert e.value.code == "conflict" and e.value.status == 409
    client.delete_mesh(mesh_name)
    with pytest.raises(tessera.TesseraError) as e:
        client.mesh(mesh_name)
    assert e.value.code == "not_found" and e.value.details["mesh"] == mesh_name


def push(cluster, mesh, value):
    """Each worker's trainer puts its shard (through the local API)."""
    for rank, url in enumerate(cluster.worker_urls):
        m = tessera.CheckpointManager(mesh, worker=url)
        m.attach("emb", (8, 2), "float32", ["data", None])[:] = value + rank
        m.close()


def test_save_list_restore_verify_delete_retention(cluster, client, mesh_name):
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    push(cluster, mesh_name, 1.0)
    job = client.save(mesh_name, 100, metadata={"note": "first"})
    assert isinstance(job, tessera.Job) and str(job) == job.id
    final = job.wait(timeout=30)
    assert final["state"] == "succeeded" and final["kind"] == "save"
    push(cluster, mesh_name, 2.0)
    client.wait_job(client.save(mesh_name, 200).id, timeout=30)
    listed = client.checkpoints(mesh_name)
    assert [c["step"] for c in listed] == [200, 100] and listed[0]["state"] == "committed"
    assert client.latest_step(mesh_name) == 200
    assert client.checkpoint(mesh_name, 100)["metadata"] == {"note": "first"}
    assert client.checkpoint(mesh_name, "latest")["step"] == 200

    # Restore step 100 onto the same mesh: the workers hold the saved values again.
    client.restore(mesh_name, 100).wait(timeout=30)
    m = tessera.CheckpointManager(mesh_name, worker=cluster.worker_urls[3])
    np.testing.assert_array_equal(m.read("emb"), np.full((2, 2), 4.0))
    # ... and resharded onto a {data: 2, model: 2} mesh, replicated.
    other = mesh_name + ".r"
    client.register_mesh(other, {"data": 2, "model": 2}, workers=cluster.worker_ids)
    client.restore(mesh_name, 100, target_mesh=other, layouts={"emb": [None, None]}).wait(30)
    r = tessera.CheckpointManager(other, worker=cluster.worker_urls[0]).read("emb")
    np.testing.assert_array_equal(r, np.repeat([1.0, 2.0, 3.0, 4.0], 2)[:, None].repeat(2, 1))

    assert client.verify(mesh_name, 200).wait(timeout=30)["state"] == "succeeded"
    client.delete_checkpoint(mesh_name, 100)
    assert [c["step"] for c in client.checkpoints(mesh_name)] == [200]
    client.set_retention(mesh_name, keep_last=1)
    push(cluster, mesh_name, 3.0)
    client.save(mesh_name, 300).wait(timeout=30)
    assert [c["step"] for c in client.checkpoints(mesh_name)] == [300]


def test_errors_name_the_culprit(cluster, client, mesh_name):
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    push(cluster, mesh_name, 1.0)
    with pytest.raises(tessera.TesseraError) as e:
        client.checkpoint(mesh_name, 12345)
    assert (e.value.code, e.value.status) == ("not_found", 404)
    assert e.value.details == {"mesh": mesh_name, "step": 12345}
    with pytest.raises(tessera.TesseraError) as e:
        client.restore(mesh_name, 12345)
    assert e.value.status == 404 and e.value.details["step"] == 12345
    with pytest.raises(tessera.TesseraError) as e:
        client.save("no-such-mesh", 1)
    assert e.value.code == "not_found" and e.value.details["mesh"] == "no-such-mesh"
    with pytest.raises(tessera.TesseraError) as e:
        client.register_mesh("bad name!", {"data": 4})
    assert e.value.code == "invalid_argument" and e.value.status == 400
    with pytest.raises(tessera.TesseraError) as e:
        client.save(mesh_name, -1)
    assert e.value.code == "invalid_argument" and e.value.details.get("field") == "step"
    # A job that fails: its error comes back as the TesseraError of wait().
    job = client.save(mesh_name, 5, tensors=["emb", "missing"])
    with pytest.raises(tessera.TesseraError) as e:
        job.wait(timeout=30)
    assert e.value.code == "not_found" and e.value.status == 404
    assert e.value.details["tensor"] == "missing" and e.value.details["job"] == job.id
    with pytest.raises(tessera.TesseraError) as e:
        client.job("j-nope")
    assert e.value.code == "not_found" and e.value.details["job"] == "j-nope"


def test_wrong_token_and_no_server(cluster):
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client(cluster.server, token="wrong").meshes()
    assert (e.value.code, e.value.status) == ("unauthenticated", 401)
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client("http://127.0.0.1:9", token="x", timeout=5).meshes()
    assert (e.value.code, e.value.status) == ("unavailable", 0)
    assert "127.0.0.1:9" in str(e.value) and e.value.details["endpoint"] == "http://127.0.0.1:9"


def test_env_defaults(cluster, monkeypatch):
    monkeypatch.setenv("TESSERA_SERVER", cluster.server)
    monkeypatch.setenv("TESSERA_TOKEN", cluster.token)
    assert tessera.Client().server == cluster.server
    assert len(tessera.Client().workers()) >= 4


def test_token_from_a_file_and_pages_of_jobs(cluster, client, mesh_name, monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_SERVER", cluster.server)
    monkeypatch.delenv("TESSERA_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(cluster.token + "\n")
    token_file.chmod(0o600)
    monkeypatch.setenv("TESSERA_TOKEN_FILE", str(token_file))
    assert len(tessera.Client().workers()) >= 4
    token_file.write_text("")
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client()
    assert e.value.code == "invalid_argument" and e.value.details["file"] == str(token_file)
    # Jobs come a page at a time, newest first; iter_jobs follows the pages.
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    push(cluster, mesh_name, 1.0)
    for step in (1, 2, 3):
        client.save(mesh_name, step).wait(timeout=60)
    page = client.jobs(mesh=mesh_name, kind="save", limit=2)
    assert [j["step"] for j in page] == [3, 2]
    rest = client.jobs(mesh=mesh_name, kind="save", limit=2, before=page[-1]["seq"])
    assert [j["step"] for j in rest] == [1]
    assert [j["step"] for j in client.iter_jobs(mesh=mesh_name, kind="save", page=2)] == [3, 2, 1]
    with pytest.raises(tessera.TesseraError) as e:
        client.jobs(limit=0)
    assert e.value.code == "invalid_argument" and e.value.details["field"] == "limit"


def test_wait_job_timeout_and_keep_alive_from_threads(cluster, client, mesh_name):
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    push(cluster, mesh_name, 1.0)
    # Many calls from several threads share nothing but the Client.
    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(lambda _: len(client.workers()), range(40)))
    assert min(sizes) >= 4
    # A trainer-driven save no trainer joins stays running: wait_job gives up.
    m = tessera.CheckpointManager(mesh_name, worker=cluster.worker_urls[0])
    handle = m.save(9)
    with pytest.raises(tessera.TesseraError) as e:
        client.wait_job(handle.job, timeout=0.3)
    assert e.value.code == "deadline_exceeded" and e.value.details["job"] == handle.job
    with pytest.raises(tessera.TesseraError) as e:
        handle.wait(timeout=0.3)
    assert e.value.code == "deadline_exceeded" and e.value.details["step"] == 9
    client.cancel_job(handle.job)
    with pytest.raises(tessera.TesseraError) as e:
        handle.wait(timeout=10)
    assert e.value.code == "conflict"
