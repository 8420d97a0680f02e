"""tesserad over HTTPS: workers and clients that trust its CA save and restore;
a client that does not trust it, or speaks plain HTTP, is refused with an error
that says why; the dashboard is served over HTTPS too."""

import os
import ssl
import urllib.request

import numpy as np
import pytest

import tessera
from tessera.local import LocalCluster, make_self_signed_cert


@pytest.fixture(scope="module")
def tls_cluster():
    c = LocalCluster(workers=2, heartbeat_ms=100, lease_ms=1500, tls=True)
    yield c
    c.stop()


def test_a_save_and_restore_over_https(tls_cluster):
    c = tls_cluster
    assert c.server.startswith("https://")
    client = c.client(timeout=30)
    assert client.health()["status"] == "ok"
    assert client.cluster()["workers"]["alive"] == 2
    client.register_mesh("m", {"data": 2}, workers=c.worker_ids)
    for rank, url in enumerate(c.worker_urls):
        m = tessera.CheckpointManager("m", worker=url)
        m.attach("emb", (8, 2), "float32", ["data", None])[:] = 1.0 + rank
        m.close()
    assert client.save("m", 1).wait(timeout=30)["state"] == "succeeded"
    for url in c.worker_urls:
        m = tessera.CheckpointManager("m", worker=url)
        m.attach("emb", (8, 2), "float32", ["data", None])[:] = 0
        m.close()
    job = client.restore("m", 1)
    assert client.wait_job(job.id, timeout=30)["state"] == "succeeded"
    for rank, url in enumerate(c.worker_urls):
        m = tessera.CheckpointManager("m", worker=url)
        got = m.attach("emb", (8, 2), "float32", ["data", None])
        assert np.all(np.asarray(got) == 1.0 + rank)
        m.close()


def test_the_ca_can_come_from_the_environment(tls_cluster, monkeypatch):
    monkeypatch.setenv("TESSERA_TLS_CA", tls_cluster.tls_ca)
    client = tessera.Client(tls_cluster.server, tls_cluster.token)
    assert client.health()["status"] == "ok"


def test_an_untrusted_certificate_is_refused_with_the_reason(tls_cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("TESSERA_TLS_CA", raising=False)
    other = make_self_signed_cert(str(tmp_path))
    client = tessera.Client(tls_cluster.server, tls_cluster.token, tls_ca=other)
    with pytest.raises(tessera.TesseraError) as e:
        client.health()
    assert e.value.code == "unavailable"
    assert "TESSERA_TLS_CA" in e.value.message and "not trusted" in e.value.message


def test_plain_http_to_the_https_port_fails_fast(tls_cluster):
    plain = tls_cluster.server.replace("https://", "http://")
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client(plain, tls_cluster.token, timeout=5).health()
    assert e.value.code in ("unavailable",)


def test_a_missing_ca_file_is_named():
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client("https://127.0.0.1:1", "t", tls_ca="/nonexistent/ca.pem")
    assert e.value.code == "invalid_argument" and e.value.details["file"] == "/nonexistent/ca.pem"


def test_the_dashboard_over_https(tls_cluster):
    ctx = ssl.create_default_context(cafile=tls_cluster.tls_ca)
    with urllib.request.urlopen(tls_cluster.server + "/", context=ctx, timeout=10) as r:
        page = r.read().decode()
    assert r.status == 200 and "<html" in page.lower()
    # Its API calls and event stream go over the same origin.
    req = urllib.request.Request(tls_cluster.server + "/api/v1/cluster",
                                 headers={"Authorization": "Bearer " + tls_cluster.token})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        assert r.status == 200
    assert os.path.exists(tls_cluster.tls_ca)
