"""The memory tier (docs/memory-tier.md) through the Python client, on a cluster of
its own: memory checkpoints commit on every worker and restore from the workers'
RAM; a worker killed with its shared memory and started again gets its share back
from a copy or from its group's parity (XOR, or Reed–Solomon for two losses),
without reading the root; with too many
losses the restore falls back to the persisted checkpoint and says why. Every
worker of this cluster is on 127.0.0.1, so the saves pass force=True (and one test
checks that they are refused without it)."""

import json
import urllib.request

import numpy as np
import pytest

import tessera
from tessera.local import LocalCluster
from eventually import eventually
from test_save_restore import each

N = 4


@pytest.fixture
def cluster():
    c = LocalCluster(workers=N, heartbeat_ms=100, lease_ms=1500)
    yield c
    c.stop()


@pytest.fixture
def mesh(cluster):
    name = "mem"
    cluster.client(timeout=30).register_mesh(name, {"data": N}, workers=cluster.worker_ids)
    return name


def open_managers(cluster, mesh):
    return [tessera.CheckpointManager(mesh, worker=cluster.worker_urls[i], timeout=60) for i in range(N)]


def attach(ms):
    """A sharded and a replicated tensor on every worker."""
    return each(ms, lambda r, m: (m.attach("w", (N * 1024, 64), "float32", ["data", None]),
                                  m.attach("b", (333,), "float32")))


def fill(arrays, step):
    for r, (w, b) in enumerate(arrays):
        w[:] = np.arange(w.size, dtype=np.float32).reshape(w.shape) + 1000 * r + step
        b[:] = step


def expect(arrays, step):
    for r, (w, b) in enumerate(arrays):
        want = np.arange(w.size, dtype=np.float32).reshape(w.shape) + 1000 * r + step
        assert np.array_equal(w, want), "rank %d: w is not step %d's" % (r, step)
        assert np.all(b == step), "rank %d: b is not step %d's" % (r, step)


def save_all(ms, step, **kw):
    handles = [m.save(step, tier="memory", force=True, **kw) for m in ms]
    for h in handles:
        h.wait(60)
    return handles


def restore_all(ms):
    return each(ms, lambda r, m: m.restore())


def roll_back(ms, arrays, step, tier):
    """Every trainer restores named `step` over overwritten tensors, from `tier`."""
    fill(arrays, 99)
    restored = each(ms, lambda r, m: m.restore(step))
    assert [(int(s), s.tier) for s in restored] == [(step, tier)] * N
    expect(arrays, step)


def expect_rebuilt_from_replica(ms, arrays, step, rank):
    """The trainers, their tensors overwritten, restore `step`; `rank`'s share (its worker
    replaced) comes from a replica."""
    fill(arrays, 99)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [step] * N
    assert restored[rank].source == "replica"
    expect(arrays, step)


def save_steps(ms, arrays, steps, **kw):
    for step in steps:
        fill(arrays, step)
        save_all(ms, step, **kw)


def save_on_disk(ms, arrays, step):
    fill(arrays, step)
    for h in [m.save(step) for m in ms]:
        h.wait(60)


@pytest.mark.parametrize("redundancy", ["replica", "parity"])
def test_memory_checkpoints_restore_from_local_ram(cluster, mesh, redundancy):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    for step in range(1, 4):
        fill(arrays, step)
        save_all(ms, step, redundancy=redundancy)
    fill(arrays, 99)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [3] * N
    assert {(s.tier, s.source) for s in restored} == {("memory", "local")}
    expect(arrays, 3)
    # keep=2: steps 2 and 3 are held, so step 2 restores by name, alone.
    fill(arrays, 99)
    each(ms, lambda r, m: m.restore(2))
    expect(arrays, 2)


@pytest.mark.parametrize("redundancy", ["replica", "parity"])
def test_lost_worker_is_rebuilt_from_peers(cluster, mesh, redundancy):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    for step in (5, 6):
        fill(arrays, step)
        save_all(ms, step, redundancy=redundancy)
    # Worker 2 dies with its shared memory; a replacement starts under its name.
    lost = 2
    restored = lose_and_restore(cluster, ms, arrays, mesh, lost, 6,
                                "replica" if redundancy == "replica" else "parity")
    assert restored[lost].tier == "memory"
    assert all(s.source == "local" for i, s in enumerate(restored) if i != lost)
    expect(arrays, 6)


def lose_and_restore(cluster, ms, arrays, mesh, lost, step, source):
    """Worker `lost` is replaced with empty RAM, the other trainers' tensors overwritten;
    every trainer restores `step`, the lost one's share from `source`."""
    replace_worker(cluster, ms, arrays, lost, mesh)
    fill([a for i, a in enumerate(arrays) if i != lost], 99)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [step] * N
    assert restored[lost].source == source
    return restored


def held(cluster, mesh, key):
    """What each worker's memory tier says of `mesh` (its /healthz): "bytes" or "steps"."""
    out = []
    for url in cluster.worker_urls:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            out.append(json.load(r)["memory_tier"]["meshes"].get(mesh, {}).get(key))
    return out


def held_bytes(cluster, mesh):
    return held(cluster, mesh, "bytes")


@pytest.mark.parametrize("redundancy,second", [("replica", 1), ("parity", 3)])
def test_a_rebuilt_worker_holds_its_redundancy_again_and_a_second_loss_restores(
        cluster, mesh, redundancy, second):
    """Worker 2 is lost and rebuilt; it then holds the step again, its share and what it
    held for its peers (the copy of rank 1's share, or its group's parity), so that the
    loss of another worker before the next checkpoint still restores from memory."""
    rebuild_then_lose_another(cluster, mesh, redundancy, second)


@pytest.mark.parametrize("redundancy,second", [("replica", 1), ("parity", 3)])
def test_a_mesh_connected_pair_by_pair_commits_rebuilds_and_restores(monkeypatch, redundancy, second):
    """A mesh of more workers than --memory-full-mesh-max (1 here) joins its memory group
    with no connection, and each exchange connects the pairs it uses (the votes' and the
    agreement's tree, the redundancy's peers, a rebuild's pairs): checkpoints commit, a
    lost worker is rebuilt and holds its redundancy again, and a second loss restores."""
    monkeypatch.setenv("TESSERA_MEMORY_FULL_MESH_MAX", "1")
    c = LocalCluster(workers=N, heartbeat_ms=100, lease_ms=1500)
    try:
        c.client(timeout=30).register_mesh("mem", {"data": N}, workers=c.worker_ids)
        rebuild_then_lose_another(c, "mem", redundancy, second)
        with open(c.dir + "/worker-0.log") as f:
            assert "its group connects the pairs its exchanges use" in f.read()
    finally:
        c.stop()


def rebuild_then_lose_another(cluster, mesh, redundancy, second):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    save_steps(ms, arrays, (1, 2), redundancy=redundancy)
    source = "replica" if redundancy == "replica" else "parity"
    lose_and_restore(cluster, ms, arrays, mesh, 2, 2, source)
    expect(arrays, 2)
    eventually(lambda: 2 in (held(cluster, mesh, "steps")[2] or []),
               lambda: "worker 2 holds step 2 again: %s" % held(cluster, mesh, "steps"))
    lose_and_restore(cluster, ms, arrays, mesh, second, 2, source)
    expect(arrays, 2)


def test_a_frozen_base_is_held_once_and_rebuilt_after_a_host_loss(cluster, mesh):
    """Only "b" changes after step 1 ("w", the larger, is a frozen base): each worker
    holds w once, not once per checkpoint it keeps, and not once more for the copy it
    keeps of its peer's; a lost worker gets w and b back from its replica."""
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    fill(arrays, 1)
    save_all(ms, 1)
    one = held_bytes(cluster, mesh)  # a share and a copy
    for step in (2, 3, 4):
        for _, b in arrays:
            b[:] = step
        save_all(ms, step)
    held = held_bytes(cluster, mesh)  # keep=2: steps 3 and 4, w shared by both
    assert all(h < 1.1 * o for h, o in zip(held, one)), (held, one)
    lose_and_restore(cluster, ms, arrays, mesh, 2, 4, "replica")
    for r, (w, b) in enumerate(arrays):
        assert np.array_equal(w, np.arange(w.size, dtype=np.float32).reshape(w.shape) + 1000 * r + 1), r
        assert np.all(b == 4), r


def test_without_host_diversity_a_memory_save_is_refused(cluster, mesh):
    ms = open_managers(cluster, mesh)
    attach(ms)
    handles = [m.save(1, tier="memory") for m in ms]
    for h in handles:
        with pytest.raises(tessera.TesseraError) as e:
            h.wait(60)
        assert e.value.code == "conflict"
        assert e.value.details.get("reason") == "no_host_diversity"
        assert "force" in str(e.value)


def replace_worker(cluster, ms, arrays, i, mesh):
    """Worker i dies with its shared memory; a replacement starts under its name and
    its trainer attaches the same tensors again (zeros)."""
    ms[i].close()
    cluster.kill_worker(i)
    cluster.start_worker(i)
    ms[i] = tessera.CheckpointManager(mesh, worker=cluster.worker_urls[i], timeout=60)
    arrays[i] = (ms[i].attach("w", (N * 1024, 64), "float32", ["data", None]),
                 ms[i].attach("b", (333,), "float32"))


def test_a_worker_lost_during_replication_fails_that_checkpoint_and_the_previous_restores(
        cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    fill(arrays, 6)
    save_all(ms, 6)
    # Step 7: three trainers save, the fourth host is lost before it sends anything.
    fill(arrays, 7)
    handles = [m.save(7, tier="memory", force=True, deadline_ms=3000) for m in ms[:3]]
    replace_worker(cluster, ms, arrays, 3, mesh)
    for h in handles:
        with pytest.raises(tessera.TesseraError) as e:
            h.wait(60)
        assert "w-host3" in str(e.value), str(e.value)
    expect_rebuilt_from_replica(ms, arrays, 6, 3)


def test_two_losses_in_a_parity_group_fall_back_to_the_persisted_checkpoint(cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    save_on_disk(ms, arrays, 2)
    save_steps(ms, arrays, (3, 4), redundancy="parity")
    replace_worker(cluster, ms, arrays, 1, mesh)
    replace_worker(cluster, ms, arrays, 2, mesh)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [2] * N
    for s in restored:
        assert (s.tier, s.source) == ("persisted", "root")
        assert "step 4" in s.fallback and "cannot be rebuilt" in s.fallback, s.fallback
        assert "w-host1" in s.fallback or "w-host2" in s.fallback, s.fallback
    expect(arrays, 2)


def test_reed_solomon_parity_rebuilds_two_losses_in_a_group(cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    for step in (3, 4):
        fill(arrays, step)
        save_all(ms, step, redundancy="parity", parity=2)
    replace_worker(cluster, ms, arrays, 1, mesh)
    replace_worker(cluster, ms, arrays, 2, mesh)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [4] * N
    assert [(s.tier, s.source) for s in restored] == [
        ("memory", "local"), ("memory", "parity"), ("memory", "parity"), ("memory", "local")]
    expect(arrays, 4)


def test_a_policy_persists_memory_checkpoints_from_ram(cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    client = cluster.client(timeout=30)
    for step in range(1, 6):
        fill(arrays, step)
        save_all(ms, step, persist_every_steps=2)
    # The first memory checkpoint persists, then one every 2 steps: 1, 3, 5.
    def persisted():
        return sorted(c["step"] for c in client.checkpoints(mesh)
                      if c.get("state") == "committed" and "persisted" in c.get("tiers", ["persisted"]))
    eventually(lambda: persisted() == [1, 3, 5], lambda: "persisted steps: %s" % persisted())
    # What was persisted is what the trainers had at that step.
    fill(arrays, 99)
    each(ms, lambda r, m: m.restore(3))
    expect(arrays, 3)


def damaged_at_step_2(cluster, fault, mesh, flipped, **save):
    """Worker 1, started again with the fault hook `fault`, damages what it holds of step
    2 once that checkpoint is taken (steps 1 and 2 of a fresh `mesh`): managers, arrays."""
    cluster.kill_worker(1)
    cluster.start_worker(1, env={fault: "2"})
    cluster.client(timeout=30).register_mesh(mesh, {"data": N}, workers=cluster.worker_ids)
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    for step in (1, 2):
        fill(arrays, step)
        save_all(ms, step, **save)
    eventually(lambda: "flipped a bit in %s of memory checkpoint step 2" % flipped in cluster.workers[1].text(),
               "worker 1 damaged %s" % flipped)
    return ms, arrays


def test_a_damaged_copy_is_named_and_the_other_copy_is_used(cluster):
    # Worker 1 flips a bit in the copy of rank 0's share it keeps of step 2.
    mesh = "mem-flip"
    ms, arrays = damaged_at_step_2(cluster, "TESSERA_FAULT_FLIP_MEMORY_COPY", mesh,
                                   "the copy of rank 0's share", replicas=2)
    replace_worker(cluster, ms, arrays, 0, mesh)
    fill(arrays, 99)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [2] * N
    assert restored[0].source == "replica"
    expect(arrays, 2)
    log = cluster.workers[1].text()
    assert "the checksum of tensor 'b' (device 0) in the copy of rank 0 held by w-host1 for step 2 " \
        "does not match" in log, log[-2000:]


def test_a_background_save_snapshots_while_the_trainer_goes_on(cluster, mesh):
    # save(background=True) returns at once; the tensors change only after
    # snapshotted(), and the checkpoint holds what they were when it was taken.
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    fill(arrays, 1)
    pending = [m.save(1, tier="memory", force=True, keep=3, background=True) for m in ms]
    assert all(isinstance(p, tessera.PendingSave) for p in pending)
    for p in pending:
        assert p.snapshotted().step == 1
    fill(arrays, 2)
    # The next save waits for the one before's snapshot by itself.
    second = [m.save(2, tier="memory", force=True, keep=3, background=True) for m in ms]
    third = [m.save(3, tier="memory", force=True, keep=3, background=True) for m in ms]
    for p in pending + second + third:
        p.wait(60)
    fill(arrays, 99)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [3] * N
    expect(arrays, 2)  # steps 2 and 3 were taken of step 2's state
    fill(arrays, 99)
    restored = each(ms, lambda r, m: m.restore(1))  # back to step 1: 2 and 3 are freed
    assert [int(s) for s in restored] == [1] * N
    expect(arrays, 1)
    # A save the worker refuses raises its error at snapshotted() and at wait(), named.
    bad = ms[0].save(4, tensors=["nope"], tier="memory", force=True, background=True)
    with pytest.raises(tessera.TesseraError) as e:
        bad.snapshotted()
    assert "nope" in str(e.value)
    with pytest.raises(tessera.TesseraError):
        bad.wait(10)


def test_a_share_damaged_in_ram_is_caught_as_it_lands_and_rebuilt_from_its_copy(cluster):
    # Worker 1's own share of step 2 goes bad in its RAM after the copies were made. A
    # restore on the live hosts checks each share as it installs it: worker 1's does not
    # match, so every worker checks what it holds and the mesh chooses again, rebuilding
    # rank 1's share from its copy on another host.
    ms, arrays = damaged_at_step_2(cluster, "TESSERA_FAULT_FLIP_MEMORY_OWN", "mem-flip-own",
                                   "its own share")
    fill(arrays, 99)
    restored = restore_all(ms)
    assert [int(s) for s in restored] == [2] * N
    assert [s.source for s in restored] == ["local", "replica", "local", "local"]
    expect(arrays, 2)
    log = cluster.workers[1].text()
    assert "in the share of step 2 held by w-host1 does not match" in log, log[-2000:]
    assert "every worker checks what it holds and the mesh chooses again" in log, log[-2000:]
    # Checked before the choice in that second round, the damaged share is named again.
    assert "in its own share held by w-host1 for step 2 does not match" in log, log[-2000:]


@pytest.mark.parametrize("change", ["replacement", "reordered"])
def test_a_mesh_registered_again_never_restores_the_old_ram(cluster, mesh, change):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    fill(arrays, 4)
    save_all(ms, 4, redundancy="parity")
    for m in ms:
        m.close()
    client = cluster.client(timeout=30)
    if change == "replacement":
        # Worker 3's host is gone for good; "spare" takes its place in the mesh.
        cluster.kill_worker(3)
        cluster.start_worker(3, name="spare")
        assert cluster.worker_ids[3] == "w-spare"
        order = list(range(N))
    else:
        # The same workers in another order: each rank's RAM holds another rank's slices.
        order = list(reversed(range(N)))
    client.delete_mesh(mesh)
    client.register_mesh(mesh, {"data": N}, workers=[cluster.worker_ids[i] for i in order])
    ms = [tessera.CheckpointManager(mesh, worker=cluster.worker_urls[i], timeout=60) for i in order]
    attach(ms)
    # Nothing to restore (None), never the old registration's step 4.
    restored = restore_all(ms)
    assert restored == [None] * N, restored


def test_a_restore_to_an_earlier_step_starts_a_new_timeline(cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    save_steps(ms, arrays, (200, 300))
    roll_back(ms, arrays, 200, "memory")
    save_steps(ms, arrays, (201, 202))
    # Worker 1 dies with its RAM, the trainers start again: the newest of this timeline.
    replace_worker(cluster, ms, arrays, 1, mesh)
    expect_rebuilt_from_replica(ms, arrays, 202, 1)


def test_a_restore_of_a_persisted_step_abandons_the_newer_memory_checkpoints(cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    save_on_disk(ms, arrays, 100)
    save_steps(ms, arrays, (200, 300))
    roll_back(ms, arrays, 100, "persisted")
    save_steps(ms, arrays, (101, 102))
    # The trainers restart (their workers' RAM is intact).
    for m in ms:
        m.close()
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    fill(arrays, 99)
    restored = restore_all(ms)
    assert [(int(s), s.tier) for s in restored] == [(102, "memory")] * N
    expect(arrays, 102)
    # tesserad lists the new timeline, not the abandoned steps.
    client = cluster.client(timeout=30)
    steps = lambda: [c["step"] for c in client.checkpoints(mesh)]
    eventually(lambda: steps() == [102, 101, 100], lambda: "checkpoints: %s" % steps())


def test_a_named_restore_is_made_by_every_trainer_on_the_same_step(cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    save_steps(ms, arrays, (1, 2))
    fill(arrays, 99)
    # Rank 3's trainer asks for another step: nobody restores, and rank 3 is named.
    outcomes = each(ms, lambda r, m: _restore_error(m, 1 if r < 3 else 2))
    assert all(code == "conflict" and "w-host3" in text for code, text in outcomes), outcomes
    expect(arrays, 99)
    restored = each(ms, lambda r, m: m.restore(1))
    assert [(int(s), s.tier) for s in restored] == [(1, "memory")] * N
    expect(arrays, 1)


def _restore_error(m, step):
    try:
        m.restore(step)
    except tessera.TesseraError as e:
        return e.code, str(e)
    return "restored", ""


def test_a_rest_save_can_target_memory(cluster, mesh):
    ms = open_managers(cluster, mesh)
    arrays = attach(ms)
    fill(arrays, 8)
    client = cluster.client(timeout=30)
    job = client.save(mesh, 8, tier="memory", force=True, redundancy="parity")
    done = job.wait(60)
    assert done["state"] == "succeeded", done
    assert done["kind"] == "memory_save" and done["result"]["tier"] == "memory", done
    assert done["result"]["bytes"] == sum(w.nbytes + b.nbytes for w, b in arrays)
    with pytest.raises(tessera.TesseraError) as e:
        client.save(mesh, 9, tier="tape")
    assert e.value.status == 400 and e.value.details.get("field") == "tier"
    # A field only the workers check fails the job, naming it.
    with pytest.raises(tessera.TesseraError) as e:
        client.save(mesh, 9, tier="memory", force=True, group=1).wait(60)
    assert e.value.details.get("field") == "group" and "group must be 2..16" in str(e.value), e.value
    fill(arrays, 99)
    restored = restore_all(ms)
    assert [(int(s), s.tier) for s in restored] == [(8, "memory")] * N
    expect(arrays, 8)
