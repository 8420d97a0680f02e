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
