"""Collectives through the workers, from 4 trainer threads."""

import numpy as np
import torch

from test_save_restore import each


def test_all_reduce_numpy_and_torch(mesh4):
    _, ms = mesh4
    got = each(ms, lambda r, m: m.all_reduce(np.arange(6, dtype=np.float32).reshape(2, 3) * r))
    for g in got:  # mean over ranks 0..3 of arange * r = arange * 1.5
        np.testing.assert_array_equal(g, np.arange(6).reshape(2, 3) * 1.5)
        assert g.dtype == np.float32 and g.flags.writeable

    def in_place(r, m):
        t = torch.full((5,), float(r), dtype=torch.bfloat16)
        assert m.all_reduce(t, reduce="sum", out=t) is t
        return t
    for t in each(ms, in_place):
        assert t.dtype == torch.bfloat16 and torch.equal(t, torch.full((5,), 6.0,
                                                                       dtype=torch.bfloat16))
    got = each(ms, lambda r, m: m.all_reduce(torch.tensor([r, -r], dtype=torch.int64),
                                              reduce="max"))
    assert all(torch.equal(g, torch.tensor([3, 0])) for g in got)


def test_all_gather_broadcast_barrier_preemption(mesh4):
    _, ms = mesh4
    got = each(ms, lambda r, m: m.all_gather(np.full((2,), r, np.int32), tiled=True))
    for g in got:
        np.testing.assert_array_equal(g, [0, 0, 1, 1, 2, 2, 3, 3])
    got = each(ms, lambda r, m: m.broadcast(np.array([r * 10.0]), root=2))
    assert all(g.tolist() == [20.0] for g in got)
    each(ms, lambda r, m: m.barrier("after-gather", timeout_ms=10000))
    assert each(ms, lambda r, m: m.reached_preemption_sync_point(5)) == [False] * 4


def test_sparse_all_reduce_both_paths_numpy_and_torch(mesh4):
    _, ms = mesh4
    rng = np.random.default_rng(5)
    dense_shape = (6, 3)
    for equal, path, want_path in [(True, "auto", "gather"), (False, "auto", "dense"),
                                   (True, "dense", "dense"), (False, "gather", "gather")]:
        rows = [2 if equal else r + 1 for r in range(4)]
        values = [rng.integers(-9, 9, (k, 3)).astype(np.float32) for k in rows]
        indices = [rng.integers(0, 6, k).astype(np.int64) for k in rows]
        want = np.zeros(dense_shape, np.float32)
        for v, i in zip(values, indices):
            np.add.at(want, i, v)
        got = each(ms, lambda r, m: m.sparse_all_reduce(values[r], indices[r], dense_shape,
                                                         path=path))
        for g in got:
            assert g.path == want_path and g.dense_shape == dense_shape
            assert g.values.dtype == np.float32 and g.indices.dtype == np.int64
            np.testing.assert_array_equal(g.dense(), want)
            if want_path == "gather":
                assert len(g.indices) == sum(rows)
    # torch in, torch out, int32 indices.
    got = each(ms, lambda r, m: m.sparse_all_reduce(
        torch.full((2, 3), float(r)), torch.tensor([r, 5], dtype=torch.int32), dense_shape))
    want = torch.zeros(dense_shape)
    for r in range(4):
        want[r] += r
        want[5] += r
    for g in got:
        assert isinstance(g.values, torch.Tensor) and g.indices.dtype == torch.int32
        assert torch.equal(g.dense(), want)


def test_sparse_all_reduce_names_the_malformed_worker(cluster, mesh4):
    from tessera import TesseraError
    _, ms = mesh4

    def call(r, m):
        idx = np.array([0, 9 if r == 1 else 1], np.int64)  # worker 1: row 9 of 4
        try:
            m.sparse_all_reduce(np.ones((2, 2), np.float32), idx, (4, 2), timeout_ms=30000)
        except TesseraError as e:
            return e
    errors = each(ms, call)
    for e in errors:
        assert e is not None and e.status == 400 and e.code == "invalid_argument"
        assert e.details["invalid_workers"] == [cluster.worker_ids[1]]
        assert e.details["field"] == "indices" and "outside [0, 4)" in str(e)
    # Refused by the client before any call: indices that are not integers.
    try:
        ms[0].sparse_all_reduce(np.ones((1, 2), np.float32), np.array([0.5]), (4, 2))
        raise AssertionError("float indices were accepted")
    except TesseraError as e:
        assert e.details.get("field") == "indices"
    got = each(ms, lambda r, m: m.sparse_all_reduce(np.ones((1, 2), np.float32),
                                                     np.array([r], np.int64), (4, 2)))
    for g in got:
        np.testing.assert_array_equal(g.dense(), np.ones((4, 2), np.float32))
