"""tesserad and 4 workers with their checkpoint root in an S3 bucket of a real Ceph
RGW (tools/s3/rgw.sh; label s3, needs root): saves, restores, verify, delete and
garbage collection over REST and from trainers, and the store's failures: a failed
part, a failed commit, an unreachable store, bad credentials and a missing bucket,
each named, each leaving earlier checkpoints intact."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import tessera  # noqa: E402
from tessera.local import LocalCluster  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "s3"))
from rgw import Rgw  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from eventually import eventually  # noqa: E402
from safetensors_files import read_safetensors, write_model_folder  # noqa: E402

BUCKET = "tessera-cluster-test"
ROWS = 4 * 1024 * 1024  # 16 MiB of float32 per worker: shards span parts (8 MiB)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the s3 tier starts Ceph: needs root")


@pytest.fixture(scope="module")
def rgw():
    try:
        store = Rgw(BUCKET)
    except RuntimeError as e:
        pytest.fail(str(e))
    yield store.endpoint, store.s3
    store.stop()


def start_cluster(endpoint, prefix, server_env=None):
    return LocalCluster(workers=4, heartbeat_ms=100, lease_ms=1500,
                        checkpoint_root="s3://%s/%s" % (BUCKET, prefix),
                        server_args=["--s3-endpoint", endpoint, "--gc-interval-ms", "0"],
                        server_env=server_env)


def keys(s3, prefix):
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
    return sorted(out)


def uploads(s3, prefix):
    return s3.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])


def each(ms, fn):
    with ThreadPoolExecutor(len(ms)) as pool:
        return list(pool.map(lambda rm: fn(*rm), enumerate(ms)))


class Trainers:
    """4 trainers, one per worker, each holding a slice of 'w' (sharded) and 'b'."""

    def __init__(self, cluster, mesh):
        self.client = cluster.client(timeout=60)
        self.client.register_mesh(mesh, {"data": 4}, workers=cluster.worker_ids)
        self.mesh = mesh
        self.cluster = cluster
        self.ms = [self.connect(i) for i in range(4)]
        self.arrays = each(self.ms, lambda r, m: self.attach(m))

    def connect(self, i):
        return tessera.CheckpointManager(self.mesh, worker=self.cluster.worker_urls[i], timeout=60)

    @staticmethod
    def attach(m):
        return m.attach("w", (4 * ROWS,), "float32", ["data"]), m.attach("b", (16,), "float32")

    def restart_worker(self, i, env=None):
        """Restarts worker i (same name, so same id); its trainer attaches again."""
        self.ms[i].close()
        self.cluster.workers[i].stop()
        self.cluster.start_worker(i, env=env)
        self.ms[i] = self.connect(i)
        self.arrays[i] = self.attach(self.ms[i])

    @staticmethod
    def values(value, rank):
        # Random, so that compression leaves the shards larger than a part.
        return np.random.default_rng(value * 10 + rank).standard_normal(ROWS, dtype=np.float32)

    def fill(self, value):
        for rank, (w, b) in enumerate(self.arrays):
            w[:] = self.values(value, rank)
            b[:] = value

    def holds(self, value):
        return all((w == self.values(value, rank)).all() and (b == value).all()
                   for rank, (w, b) in enumerate(self.arrays))

    def save(self, step):
        """Every trainer saves `step`; the answers of their wait(), or their errors."""
        def one(rank, m):
            try:
                return m.save(step).wait(timeout=90)
            except tessera.TesseraError as e:
                return e
        return each(self.ms, one)

    def commit(self, step):
        """Fills the state with `step`'s values and saves it; every trainer sees it committed."""
        self.fill(step)
        answers = self.save(step)
        assert all(not isinstance(r, Exception) and r["state"] == "committed" for r in answers), answers

    def close(self):
        for m in self.ms:
            m.close()
        self.client.close()


@pytest.fixture(scope="module")
def cluster(rgw):
    c = start_cluster(rgw[0], "main")
    yield c
    c.stop()


def test_save_restore_verify_delete_and_gc_in_a_bucket(rgw, cluster):
    _, s3 = rgw
    t = Trainers(cluster, "m1")
    try:
        t.commit(1)
        t.commit(2)
        # Committed = a manifest per step naming its staging prefix; shards, index.
        names = keys(s3, "main/m1/")
        assert "step-1.commit" in names and "step-2.commit" in names, names
        assert sum(n.endswith("/index.sqlite") for n in names) == 2, names
        assert sum("/shard-" in n for n in names) == 8, names
        assert not any("fragment" in n for n in names), names
        assert uploads(s3, "main/") == []
        t.fill(0)
        assert each(t.ms, lambda r, m: m.restore(1)) == [1] * 4
        assert t.holds(1)
        assert t.client.verify("m1", 2).wait(60)["state"] == "succeeded"
        # Restore through REST, onto the same mesh.
        t.fill(0)
        assert t.client.restore("m1", 2).wait(60)["state"] == "succeeded"
        assert t.holds(2)
        # Delete: the manifest and every object of the step go.
        t.client.delete_checkpoint("m1", 1)
        assert [c["step"] for c in t.client.checkpoints("m1")] == [2]
        names = keys(s3, "main/m1/")
        # Left: step 2's manifest, index, summary and 4 shards, and the mesh's document.
        assert "step-1.commit" not in names and len(names) == 1 + 1 + 1 + 4 + 1, names
        assert "mesh-1.json" in names, names
        assert t.client.collect_garbage() == []
        # Retention: keep the last one.
        t.client.set_retention("m1", keep_last=1)
        t.commit(3)
        # The trainers hear of the commit before its retention, which then follows.
        eventually(lambda: [c["step"] for c in t.client.checkpoints("m1")] == [3],
                   what="retention after step 3 keeps it alone")
        assert [n for n in keys(s3, "main/m1/") if n.endswith(".commit")] == ["step-3.commit"]
    finally:
        t.close()


def test_incremental_saves_share_chunks_and_a_retired_step_keeps_only_them(rgw, cluster):
    _, s3 = rgw
    t = Trainers(cluster, "inc")
    try:
        t.commit(1)
        for w, b in t.arrays:
            b[:] = 42.0  # only b changes: w's chunks are step 1's
        assert all(r["state"] == "committed" for r in t.save(2))
        assert t.client.checkpoint("inc", 2)["referenced_bytes"] > 0
        # Step 1 is retired: its manifest goes, its prefix keeps the shards step 2 uses.
        t.client.delete_checkpoint("inc", 1)
        assert [c["step"] for c in t.client.checkpoints("inc")] == [2]
        step1 = sorted(n for n in keys(s3, "main/inc/") if n.startswith(".staging-1-w/"))
        assert "step-1.commit" not in keys(s3, "main/inc/")
        assert step1[0] == ".staging-1-w/retired" and len(step1) == 5, step1
        assert all("/shard-" in n for n in step1[1:]), step1
        t.fill(0)
        assert each(t.ms, lambda r, m: m.restore(2)) == [2] * 4
        assert all((w == t.values(1, rank)).all() and (b == 42.0).all()
                   for rank, (w, b) in enumerate(t.arrays))
        assert t.client.verify("inc", 2).wait(60)["state"] == "succeeded"
        # Its step cannot be saved again while its files are in use; what that attempt
        # wrote into the retired prefix is collected, what step 2 uses is not.
        failed = t.save(1)
        assert all(isinstance(e, tessera.TesseraError) and e.code == "conflict" for e in failed), failed
        assert "was deleted" in str(failed[0]), failed[0]
        t.client.collect_garbage()
        assert sorted(n for n in keys(s3, "main/inc/") if n.startswith(".staging-1-w/")) == step1
        # The last checkpoint that uses them goes: so do they.
        t.client.delete_checkpoint("inc", 2)
        assert not [n for n in keys(s3, "main/inc/") if n.startswith(".staging-")]
        assert uploads(s3, "main/inc/") == []
    finally:
        t.close()


def test_safetensors_export_into_a_bucket_and_import_into_its_root(rgw, cluster, tmp_path):
    """A REST export job writes into an s3:// prefix, each worker its files; a REST
    import job and `tessera import` make checkpoints in the bucket from a local folder."""
    endpoint, s3 = rgw
    t = Trainers(cluster, "st")
    try:
        t.commit(1)
        job = t.client.export("st", 1, "s3://%s/hf/st-1" % BUCKET).wait(timeout=120)
        names = keys(s3, "hf/st-1/")
        files = sorted(n for n in names if n.endswith(".safetensors"))
        assert len(files) == 2 and "model.safetensors.index.json" in names, names  # w and b
        assert sorted(job["result"]["files"]) == files
        for f in files:
            s3.download_file(BUCKET, "hf/st-1/" + f, str(tmp_path / f))
            got, _ = read_safetensors(tmp_path / f)
            if "w" in got:
                assert np.array_equal(got["w"][1], np.concatenate([t.values(1, r) for r in range(4)]))
            if "b" in got:
                assert (got["b"][1] == 1).all()
        # Import from a local folder into the bucket's root, then restore into the trainers.
        w = np.concatenate([t.values(7, r) for r in range(4)])
        write_model_folder(tmp_path / "in", [{"w": w}, {"b": np.full(16, 7, dtype=np.float32)}])
        assert t.client.import_safetensors("st", tmp_path / "in", 7).wait(timeout=120)["state"] == "succeeded"
        assert "step-7.commit" in keys(s3, "main/st/")
        t.fill(0)
        assert each(t.ms, lambda r, m: m.restore(7)) == [7] * 4
        assert t.holds(7)
    finally:
        t.close()
    # Offline, into another prefix of the bucket.
    cli = os.path.join(cluster.bin_dir, "tessera")
    env = dict(os.environ, TESSERA_S3_ENDPOINT=endpoint)
    r = subprocess.run([cli, "import", str(tmp_path / "in"), "s3://%s/offline" % BUCKET, "--mesh", "llm",
                        "--step", "3"], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([cli, "verify", "s3://%s/offline/llm/step-3" % BUCKET], env=env, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0 and r.stdout.startswith("OK"), (r.stdout, r.stderr)


def failed(answers):
    errors = [a for a in answers if isinstance(a, tessera.TesseraError)]
    assert errors, answers
    return " ".join("%s %s %s" % (e.code, e, e.details) for e in errors)


def test_a_failed_part_fails_the_save_naming_worker_and_part(rgw, cluster):
    _, s3 = rgw
    t = Trainers(cluster, "m2")
    try:
        t.commit(1)
        # Worker 2's store answers every second part with 503 SlowDown.
        t.restart_worker(2, env={"TESSERA_FAULT_S3": "partNumber=2&", "TESSERA_S3_RETRY_MS": "500"})
        t.fill(2)
        text = failed(t.save(2))
        assert cluster.worker_ids[2] in text and "part 2" in text and BUCKET in text, text
        states = {c["step"]: c["state"] for c in t.client.checkpoints("m2")}
        assert states == {1: "committed", 2: "failed"}, states
        # Nothing of step 2 is left: no objects, no unfinished upload. Workers still
        # writing when the job failed are collected one lease later (1.5 s here).
        def left():
            return ([n for n in keys(s3, "main/m2/") if n.startswith((".staging-2-", "step-2"))],
                    uploads(s3, "main/m2/"))
        eventually(lambda: left() == ([], []), lambda: left(), interval=0.2)
        t.fill(0)
        assert each(t.ms, lambda r, m: m.restore(1)) == [1] * 4 and t.holds(1)
    finally:
        t.restart_worker(2)
        t.close()


def test_unreachable_store_and_bad_credentials_are_named(rgw, cluster):
    t = Trainers(cluster, "m3")
    try:
        t.commit(1)
        # Worker 1 is given a store address where nothing listens.
        t.restart_worker(1, env={"TESSERA_S3_ENDPOINT": "http://127.0.0.1:1",
                                 "TESSERA_S3_RETRY_MS": "500"})
        text = failed(t.save(2))
        assert "unavailable" in text and "http://127.0.0.1:1" in text and BUCKET in text, text
        assert cluster.worker_ids[1] in text, text
        # ... then the right address but a wrong secret.
        t.restart_worker(1, env={"AWS_SECRET_ACCESS_KEY": "wrong"})
        text = failed(t.save(3))
        assert "unauthenticated" in text and BUCKET in text and cluster.worker_ids[1] in text, text
        states = {c["step"]: c["state"] for c in t.client.checkpoints("m3")}
        assert states == {1: "committed", 2: "failed", 3: "failed"}, states
        # A restore it cannot read is refused as such, not as a missing checkpoint.
        with pytest.raises(tessera.TesseraError) as e:
            t.ms[1].restore(1)
        assert "unauthenticated" in str(e.value) or e.value.code == "unauthenticated", e.value
        t.restart_worker(1)
        t.fill(0)
        assert each(t.ms, lambda r, m: m.restore(1)) == [1] * 4 and t.holds(1)
    finally:
        t.restart_worker(1)
        t.close()


def commit_two_and_stop(endpoint, prefix, mesh, then=None):
    """Steps 1 and 2 of `mesh` committed under `prefix` (and `then(trainers)`), then
    every process stopped; the cluster's bin dir."""
    cluster = start_cluster(endpoint, prefix)
    t = Trainers(cluster, mesh)
    try:
        t.commit(1)
        t.commit(2)
        if then:
            then(t)
    finally:
        t.close()
        cluster.stop()
    return cluster.bin_dir


def test_a_tesserad_with_an_empty_catalog_rebuilds_from_the_bucket(rgw):
    endpoint, s3 = rgw
    commit_two_and_stop(endpoint, "rebuild", "m6", lambda t: t.client.set_retention("m6", keep_last=5))
    # Another tesserad, a fresh data dir, the same prefix; workers under the same names.
    second = start_cluster(endpoint, "rebuild")
    t = Trainers(second, "m6")  # registering the same mesh again is a no-op (200)
    try:
        assert [c["step"] for c in t.client.checkpoints("m6")] == [2, 1]
        assert t.client.mesh("m6")["retention"]["keep_last"] == 5
        t.fill(0)
        assert each(t.ms, lambda r, m: m.restore(1)) == [1] * 4 and t.holds(1)
        assert t.client.verify("m6", 2).wait(60)["state"] == "succeeded"
        t.commit(3)
        assert [c["step"] for c in t.client.checkpoints("m6")] == [3, 2, 1]
    finally:
        t.close()
        second.stop()


def test_the_cli_lists_inspects_and_verifies_a_bucket_without_tesserad(rgw):
    endpoint, s3 = rgw
    bin_dir = commit_two_and_stop(endpoint, "cli", "m8")  # nothing of Tessera runs from here on
    cli = os.path.join(bin_dir, "tessera")
    env = dict(os.environ, TESSERA_S3_ENDPOINT=endpoint)
    root = "s3://%s/cli" % BUCKET

    def run(*args):
        return subprocess.run([cli] + list(args), env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    listed = json.loads(run("ls", "--json", root).stdout)
    steps = [c["step"] for m in listed["meshes"] if m["mesh"] == "m8" for c in m["checkpoints"]]
    assert steps == [1, 2], listed
    assert all(c["logical_bytes"] > 0 for m in listed["meshes"] for c in m["checkpoints"]), listed
    shown = run("inspect", "--json", root + "/m8/step-2")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["step"] == 2
    checked = run("verify", root + "/m8/step-2")
    assert checked.returncode == 0 and checked.stdout.startswith("OK"), (checked.stdout, checked.stderr)
    missing = run("inspect", root + "/m8/step-9")
    assert missing.returncode == 1 and "no committed checkpoint at %s/m8/step-9" % root in missing.stderr, \
        missing.stderr


def test_a_failed_commit_leaves_no_step(rgw):
    endpoint, s3 = rgw
    c = start_cluster(endpoint, "commit", server_env={"TESSERA_FAULT_S3": "step-2.commit",
                                                      "TESSERA_S3_RETRY_MS": "500"})
    t = Trainers(c, "m4")
    try:
        t.commit(1)
        text = failed(t.save(2))
        assert "step-2.commit" in text and endpoint in text, text
        states = {ck["step"]: ck["state"] for ck in t.client.checkpoints("m4")}
        assert states == {1: "committed", 2: "failed"}, states
        assert [n for n in keys(s3, "commit/m4/") if n.endswith(".commit")] == ["step-1.commit"]
        assert not any(n.startswith(".staging-2-") for n in keys(s3, "commit/m4/"))
        t.fill(0)
        assert each(t.ms, lambda r, m: m.restore(1)) == [1] * 4 and t.holds(1)
    finally:
        t.close()
        c.stop()


def test_a_missing_bucket_or_unreachable_store_stops_tesserad_at_start(rgw, tmp_path):
    endpoint, _ = rgw
    bins = os.environ.get("TESSERA_BIN") or os.path.join(HERE, "..", "..", "build", "bin")
    for root, ep, want in [("s3://no-such-bucket-x/p", endpoint, "no-such-bucket-x"),
                           ("s3://%s/p" % BUCKET, "http://127.0.0.1:1", "http://127.0.0.1:1")]:
        r = subprocess.run([os.path.join(bins, "tesserad"), "--listen", "127.0.0.1:0",
                            "--data-dir", str(tmp_path / "d"), "--checkpoint-root", root,
                            "--s3-endpoint", ep], text=True, timeout=120,
                           env=dict(os.environ, TESSERA_S3_RETRY_MS="500"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert r.returncode != 0
        assert want in r.stderr, r.stderr
