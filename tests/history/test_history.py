"""Randomized histories against a real cluster, checked as Jepsen's checkers do
(checker.py): training jobs saving (disk incremental and full, memory), restoring the
latest step and named ones (rollbacks), a REST client deleting steps and changing
retention, while the nemesis SIGKILLs tesserad and workers and starts them again.
Then, with the cluster healthy, every step listed is restored and verified, and the
checker proves its properties over the whole history.

Sizes by environment:
  TESSERA_HISTORY_SEED    the seed (default: a fresh one, printed); the same seed makes
                          the same choices
  TESSERA_HISTORY_OPS     operations of the clients, all together (default 40)
  TESSERA_HISTORY_KILL_P  chance of a kill after each completed operation (default 0.1)
  TESSERA_HISTORY_JOBS    training jobs, each on a mesh of its own (default 2)
  TESSERA_HISTORY_MEMORY  0: no memory-tier saves (default 1)
  TESSERA_HISTORY_KILL    all (default) or tesserad: what the nemesis kills. A save
                          whose worker died waits 120 s for its missing trainer, so
                          the quick tier kills tesserad alone
  TESSERA_HISTORY_DIR     where a failing history is kept (default: the temp dir)
  TESSERA_HISTORY_KEEP    1: keep the history and the cluster's logs of a passing run too

The root is a directory (posix) or a bucket of a real Ceph RGW (s3, needs root).
"""

import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "s3"))
sys.path.insert(0, HERE)

import tessera  # noqa: E402
from tessera.local import LocalCluster  # noqa: E402
from eventually import eventually  # noqa: E402
from checker import Checker  # noqa: E402
from history import Hang, History, Runner  # noqa: E402
from workload import N, OP_S, Faults, Job, Nemesis, RestClient  # noqa: E402

BUCKET = "tessera-history-test"


def setting(name, default, kind=int):
    value = os.environ.get("TESSERA_HISTORY_" + name)
    return kind(value) if value not in (None, "") else default


@pytest.fixture
def root(request, tmp_path):
    """(checkpoint_root, server_args) for the parameter's kind of root."""
    if request.param == "posix":
        yield None, []
        return
    if os.geteuid() != 0:
        pytest.skip("the s3 root starts a Ceph RGW (tools/s3/rgw.sh), which needs root")
    from rgw import Rgw  # noqa: PLC0415 - boto3 only for this root
    try:
        store = Rgw(BUCKET)
    except RuntimeError as e:
        pytest.fail(str(e))
    yield "s3://%s/history-%d" % (BUCKET, os.getpid()), ["--s3-endpoint", store.endpoint]
    store.stop()


def heal(cluster, faults):
    """Starts whatever the nemesis left dead and waits until every worker is alive."""
    if not cluster.server_process.alive():
        cluster.start_server()
    for i in range(N):
        if not cluster.workers[i].alive():
            with faults.lock:
                cluster.start_worker(i)
                faults.generation[i] += 1
    client = cluster.client(timeout=30)

    def all_alive():
        try:
            states = {w["id"]: w.get("state") for w in client.workers()}
        except tessera.TesseraError:
            return False
        return all(states.get(w) == "alive" for w in cluster.worker_ids)
    eventually(all_alive, what=lambda: "every worker alive: %s" % client.workers(), timeout=60)
    return client


def settle(client, mesh):
    """Until no save of the mesh is in flight: one that a kill left indeterminate may
    still commit, and the final listing must come after it. A save that some of its
    trainers never joined (their worker was dead) waits for them 120 s before failing."""
    busy = ("pending", "queued", "running", "writing", "merging")
    eventually(lambda: not [j for j in client.jobs(mesh=mesh) if j.get("state") in busy],
               what=lambda: "no job of %s in flight: %s" % (mesh, [
                   (j.get("id"), j.get("kind"), j.get("step"), j.get("state"))
                   for j in client.jobs(mesh=mesh) if j.get("state") in busy]), timeout=300)


def final_checks(job, client, runner):
    """Lists the mesh, restores every persisted committed step and verifies it."""
    eventually(job.ready, what="every trainer of %s attached" % job.mesh, timeout=60)
    settle(client, job.mesh)
    listed, err = runner.run("final", "final-list", {"mesh": job.mesh}, lambda: (
        "ok", [{"step": c["step"], "state": c.get("state"),
                "tiers": c.get("tiers", ["persisted"])} for c in client.checkpoints(job.mesh)]),
        OP_S)
    if err is not None:
        return
    for c in listed:
        if c["state"] != "committed" or "persisted" not in c["tiers"]:
            continue
        job.restore(c["step"], f="final-restore")
        runner.run("final", "verify", {"mesh": job.mesh, "step": c["step"]}, lambda step=c["step"]: (
            "ok", {"ok": client.verify(job.mesh, step).wait(timeout=120)["result"]["ok"]}), OP_S)


def run_history(root_kind, checkpoint_root, server_args):
    seed = setting("SEED", random.SystemRandom().randrange(1 << 31))
    ops = setting("OPS", 40)
    kill_p = setting("KILL_P", 0.1, float)
    jobs_n = setting("JOBS", 2)
    memory = bool(setting("MEMORY", 1))
    kill = setting("KILL", "all", str)
    assert kill in ("all", "tesserad"), "TESSERA_HISTORY_KILL must be all or tesserad"
    keep_dir = os.environ.get("TESSERA_HISTORY_DIR") or tempfile.gettempdir()
    os.makedirs(keep_dir, exist_ok=True)
    path = os.path.join(keep_dir, "tessera-history-%s-%d.jsonl" % (root_kind, seed))
    cluster_dir = tempfile.mkdtemp(prefix="tessera-history-%s-%d-" % (root_kind, seed))
    print("history: seed=%d root=%s ops=%d kill_p=%g kill=%s jobs=%d memory=%d history=%s" % (
        seed, root_kind, ops, kill_p, kill, jobs_n, memory, path), flush=True)
    started = time.monotonic()
    history = History(path)
    history.note("setup", "config", {"seed": seed, "root": root_kind, "ops": ops,
                                     "kill_p": kill_p, "jobs": jobs_n, "memory": memory, "kill": kill})
    cluster = LocalCluster(workers=N, heartbeat_ms=100, lease_ms=1500, dir=cluster_dir,
                           checkpoint_root=checkpoint_root, server_args=server_args)
    runner = Runner(history, threads=4 * (jobs_n + 2))
    pools = [ThreadPoolExecutor(N, thread_name_prefix="job%d" % j) for j in range(jobs_n)]
    faults = Faults(cluster)
    nemesis = Nemesis(seed, cluster, faults, history, kill_p, workers=kill == "all")
    jobs = []
    errors = []
    try:
        client = cluster.client(timeout=30)
        jobs = [Job(j, seed, cluster, faults, runner, pools[j], memory) for j in range(jobs_n)]
        for job in jobs:
            job.connect()
        rest = RestClient(seed, runner, cluster.client(timeout=30), jobs)
        per_client = max(1, ops // (jobs_n + 1))

        def drive(step):
            try:
                for _ in range(per_client):
                    if errors:
                        return
                    step()
            except BaseException as e:  # noqa: BLE001 - a hang or a bug of the test
                errors.append(e)

        threads = [threading.Thread(target=drive, args=(lambda job=job: job.step(client),))
                   for job in jobs] + [threading.Thread(target=drive, args=(rest.step,))]
        nemesis.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        nemesis.stop()
        if nemesis.error is not None:
            errors.append(nemesis.error)
        if not any(isinstance(e, Hang) for e in errors):
            client = heal(cluster, faults)
            for job in jobs:
                final_checks(job, client, runner)
    except (Hang, AssertionError, tessera.TesseraError) as e:
        errors.append(e)  # the history so far is still checked
    finally:
        nemesis.stop()
        for job in jobs:
            job.close()
        runner.close()
        for p in pools:
            p.shutdown(wait=False, cancel_futures=True)
        history.close()
        cluster.stop()
        nemesis.finish()

    checker = Checker(history.events, {job.mesh: job.index for job in jobs})
    violations = checker.check()
    problems = violations + [{"property": "test", "message": repr(e)} for e in errors
                             if not isinstance(e, Hang)]
    completed = sum(1 for e in history.events if e["type"] != "invoke" and
                    e["process"] not in ("nemesis", "setup") and
                    e["f"] not in ("skip", "timeline"))
    result = "ok" if not problems else "FAILED (%d)" % len(problems)
    print("history: seed=%d root=%s operations=%d kills=%d restarts=%d seconds=%.0f result=%s"
          % (seed, root_kind, completed, faults.kills, faults.restarts,
             time.monotonic() - started, result), flush=True)
    for note in checker.notes:
        print("  note: " + note)
    if problems:
        with open(path + ".violations.json", "w") as f:
            json.dump(problems, f, indent=1)
        report = "\n".join("  [%s] %s" % (p["property"], p["message"]) for p in problems[:20])
        pytest.fail("seed %d (%s root): %d violation(s); history kept in %s, cluster logs in %s; "
                    "replay with TESSERA_HISTORY_SEED=%d\n%s" % (
                        seed, root_kind, len(problems), path, cluster_dir, seed, report),
                    pytrace=False)
    if not setting("KEEP", 0):
        os.remove(path)
        shutil.rmtree(cluster_dir, ignore_errors=True)


@pytest.mark.parametrize("root", ["posix", "s3"], indirect=True)
def test_history(root, request):
    checkpoint_root, server_args = root
    run_history(request.node.callspec.params["root"], checkpoint_root, server_args)
