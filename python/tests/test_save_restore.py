"""save() from inside the loop of 4 trainers, restore(), latest_step(), all_steps()."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tessera
from eventually import eventually


def each(ms, fn):
    """fn(rank, manager) on 4 threads at once, like 4 trainers; their results by rank."""
    with ThreadPoolExecutor(len(ms)) as pool:
        return list(pool.map(lambda rm: fn(*rm), enumerate(ms)))


def attach_all(ms):
    def attach(rank, m):
        w = m.attach("layer/w", (8, 4), "float32", ["data", None])
        b = m.attach("layer/b", (4,), "float32")
        return w, b
    return each(ms, attach)


def fill(arrays, value):
    for rank, (w, b) in enumerate(arrays):
        w[:] = value + rank
        b[:] = value


def test_four_trainers_make_one_job_and_restore_the_saved_values(mesh4, client):
    mesh, ms = mesh4
    arrays = attach_all(ms)
    fill(arrays, 1.0)
    handles = each(ms, lambda rank, m: m.save(10, metadata={"epoch": 3}))
    fill(arrays, 99.0)  # the loop goes on at once, overwriting what was saved
    assert all(h.step == 10 and h.snapshot_ms >= 0 for h in handles)
    assert len({h.job for h in handles}) == 1  # one job for the four trainers
    for h in handles:
        assert h.wait(timeout=30)["state"] == "committed" and h.done()
    detail = client.checkpoint(mesh, 10)
    assert detail["state"] == "committed" and detail["metadata"] == {"epoch": 3}
    assert sorted(t["name"] for t in detail["tensors"]) == ["layer/b", "layer/w"]

    assert each(ms, lambda rank, m: m.restore(10)) == [10] * 4
    for rank, (w, b) in enumerate(arrays):  # restored in place, into the same memory
        assert (w == 1.0 + rank).all() and (b == 1.0).all()


def test_latest_all_steps_and_restore_latest(mesh4):
    _, ms = mesh4
    arrays = attach_all(ms)
    assert [m.latest_step() for m in ms] == [None] * 4
    assert ms[0].all_steps() == []
    for step in (1, 2, 3):
        fill(arrays, float(step))
        each(ms, lambda rank, m: m.save(step))
    each(ms, lambda rank, m: m.wait_until_finished(timeout=30))
    assert [m.latest_step() for m in ms] == [3] * 4
    assert ms[2].all_steps() == [1, 2, 3]
    fill(arrays, 0.0)
    assert each(ms, lambda rank, m: m.restore()) == [3] * 4  # None = latest
    assert all((b == 3.0).all() for _, b in arrays)
    assert each(ms, lambda rank, m: m.restore(2)) == [2] * 4
    assert all((w == 2.0 + r).all() for r, (w, _) in enumerate(arrays))


def test_save_of_a_subset(mesh4, client):
    mesh, ms = mesh4
    arrays = attach_all(ms)
    fill(arrays, 5.0)
    handles = each(ms, lambda rank, m: m.save(7, tensors=["layer/b"]))
    handles[0].wait(timeout=30)
    assert [t["name"] for t in client.checkpoint(mesh, 7)["tensors"]] == ["layer/b"]


def test_one_trainer_missing_fails_the_save_naming_its_worker(cluster, client, mesh_name):
    # A short trainer wait is not configurable from here; a save that one trainer
    # never joins is instead cancelled from the control plane, and every handle
    # reports the job's error.
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    ms = [tessera.CheckpointManager(mesh_name, worker=u) for u in cluster.worker_urls]
    try:
        attach_all(ms)
        handles = each(ms[:3], lambda rank, m: m.save(4))
        job = handles[0].job
        client.cancel_job(job)
        with pytest.raises(tessera.TesseraError) as e:
            handles[1].wait(timeout=30)
        assert e.value.status >= 400 and e.value.details.get("job", job) == job
        with pytest.raises(tessera.TesseraError):
            handles[1].done()  # stays failed
        assert ms[0].latest_step() is None
    finally:
        for m in ms:
            m.close()


def test_a_trainer_late_to_a_save_that_failed_gets_its_failure_not_a_wait(mesh4, client):
    """Three trainers save step 4 and their save fails (cancelled here) before the fourth
    saves it: the fourth's save() fails at once naming that job, instead of starting a
    save that waits for the three, who have moved on. Its next save() is a new save."""
    _, ms = mesh4
    attach_all(ms)
    handles = each(ms[:3], lambda rank, m: m.save(4))
    job = handles[0].job
    client.cancel_job(job)
    with pytest.raises(tessera.TesseraError):
        handles[0].wait(timeout=30)

    def heard():  # worker 3 was told of the end: its record of step 4 says so
        try:
            ms[3]._save_status(4, None, None)
        except tessera.TesseraError as e:
            return e.status == 409
        return False
    eventually(heard, "worker 3 was told that the save of step 4 failed")
    with pytest.raises(tessera.TesseraError) as e:
        ms[3].save(4)
    assert e.value.status == 409
    assert e.value.details.get("job") == job and e.value.details.get("reason") == "job_ended"
    again = ms[3].save(4)  # a new save of step 4, which the others would join
    assert again.job != job
    client.cancel_job(again.job)


def test_values_written_after_save_returned_are_not_in_the_checkpoint(mesh4):
    _, ms = mesh4
    arrays = attach_all(ms)
    big = [m.attach("big", (4, 1 << 18), "float32", ["data", None]) for m in ms]  # 1 MiB each
    for rank, a in enumerate(big):
        a[:] = rank
    handles = each(ms, lambda rank, m: m.save(20))
    for a in big:
        a[:] = -1.0
    fill(arrays, -1.0)
    for h in handles:
        h.wait(timeout=30)
    each(ms, lambda rank, m: m.restore(20, tensors=["big"]))
    for rank, a in enumerate(big):
        assert (a == rank).all()
    assert all((b == -1.0).all() for _, b in arrays)  # not asked for: untouched
    np.testing.assert_array_equal(ms[1].read("big")[:, :3], [[1, 1, 1]])
