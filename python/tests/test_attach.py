"""attach(): the local shard lives in the worker's shared memory, zero copy."""

import threading

import numpy as np
import pytest
import torch

import tessera


def test_numpy_float32_is_the_workers_memory(mesh4):
    _, ms = mesh4
    for rank, m in enumerate(ms):
        a = m.attach("w", (8, 3), np.float32, ["data", None])
        assert a.shape == (2, 3) and a.dtype == np.float32
        a[:] = np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * rank
    for rank, m in enumerate(ms):
        # What the worker serves is what was written through the array: no copy, no push.
        np.testing.assert_array_equal(m.read("w"), np.arange(6).reshape(2, 3) + 10 * rank)
        listed = {t["name"]: t for t in m.tensors()}
        assert listed["w"]["shape"] == [8, 3] and listed["w"]["layout"] == ["data", "unsharded"]


def test_numpy_int64_replicated(mesh4):
    _, ms = mesh4
    a = ms[0].attach("step-counter", (), "int64")
    assert a.shape == () and a.dtype == np.int64
    a[...] = 1 << 40
    assert ms[0].read("step-counter") == 1 << 40
    b = ms[1].attach("ids", (5,), np.int64, layout=None)
    b[:] = [-1, 0, 1, 2, 1 << 62]
    np.testing.assert_array_equal(ms[1].read("ids"), [-1, 0, 1, 2, 1 << 62])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_torch_dtypes(mesh4, dtype):
    _, ms = mesh4
    t = ms[2].attach("t", (4, 8), dtype, [None, "data"], like="torch")
    assert isinstance(t, torch.Tensor) and t.dtype == dtype and tuple(t.shape) == (4, 2)
    t.copy_(torch.arange(8).reshape(4, 2).to(dtype) * 3)
    raw = ms[2].read("t")
    expect = (torch.arange(8).reshape(4, 2).to(dtype) * 3)
    if dtype == torch.bfloat16:
        assert raw.dtype == np.uint16  # the bits
        expect = expect.view(torch.int16).numpy().view(np.uint16)
    else:
        expect = expect.numpy()
    np.testing.assert_array_equal(raw, expect)


def test_same_description_gives_the_same_array(mesh4):
    _, ms = mesh4
    a = ms[0].attach("x", (4,), "float32", ["data"])
    b = ms[0].attach("x", [4], np.dtype("float32"), ("data",))
    assert a is b
    c = ms[0].attach("x", (4,), torch.float32, ["data"], like="torch")
    c.fill_(5)
    assert a[0] == 5  # the numpy and torch views share the mapping


def test_bfloat16_with_numpy_is_ml_dtypes_or_refused(mesh4):
    """numpy has no bfloat16: ml_dtypes' (installed with jax) when it is there, else a
    refusal naming the tensor and the way out."""
    _, ms = mesh4
    try:
        import ml_dtypes  # noqa: PLC0415
    except ImportError:
        with pytest.raises(tessera.TesseraError) as e:
            ms[0].attach("bf", (4,), "bfloat16")
        assert e.value.code == "invalid_argument" and e.value.details["tensor"] == "bf"
        assert "like=\"torch\"" in str(e.value)
        return
    a = ms[0].attach("bf", (4,), "bfloat16", ["data"])
    assert a.dtype == np.dtype(ml_dtypes.bfloat16) and a.shape == (1,)
    a[0] = 1.5
    t = ms[0].attach("bf", (4,), "bfloat16", ["data"], like="torch")
    assert float(t[0]) == 1.5  # the same bytes through torch


def test_every_dtype_name(mesh4):
    _, ms = mesh4
    for name in ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8",
                 "bool"):
        a = ms[3].attach("d/" + name, (4,), name, ["data"])
        assert a.dtype == np.dtype(name) and a.shape == (1,)
        a[0] = 1
        assert ms[3].read("d/" + name)[0] == 1


def test_detach_drops_the_tensor(mesh4):
    _, ms = mesh4
    ms[0].attach("gone", (4,), "float32")
    ms[0].detach("gone")
    assert "gone" not in {t["name"] for t in ms[0].tensors()}
    with pytest.raises(tessera.TesseraError) as e:
        ms[0].read("gone")
    assert e.value.code == "not_found" and e.value.details["tensor"] == "gone"


def test_two_devices_per_worker():
    from tessera.local import LocalCluster
    with LocalCluster(workers=2, devices_per_worker=2) as c:
        c.client().register_mesh("dp", {"data": 2, "model": 2}, devices_per_worker=2)
        ms = [tessera.CheckpointManager("dp", worker=u) for u in c.worker_urls]
        assert [m.devices for m in ms] == [[0, 1], [2, 3]]
        with pytest.raises(tessera.TesseraError) as e:
            ms[0].attach("w", (4, 4), "float32", ["data", "model"])
        assert e.value.details["devices"] == [0, 1] and e.value.details["tensor"] == "w"
        for m in ms:
            for d in m.devices:
                m.attach("w", (4, 4), "float32", ["data", "model"], device=d)[:] = d
        np.testing.assert_array_equal(ms[1].read("w", device=3), np.full((2, 2), 3.0))
        # Collectives take the worker's devices stacked on a first axis.
        out = [None, None]

        def reduce(i):
            out[i] = ms[i].all_reduce(np.array([[1.0, i], [2.0, i]], np.float32), reduce="sum",
                                      axes=["data"], timeout_ms=10000)
        threads = [threading.Thread(target=reduce, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Along data, device 0 meets device 2 and device 1 meets device 3.
        np.testing.assert_array_equal(out[0], [[2.0, 1.0], [4.0, 1.0]])
        np.testing.assert_array_equal(out[1], out[0])
        # sparse_all_reduce takes and gives a list, one entry per device: device d
        # brings d+1 rows of ones for row d % 3 of a [3, 1] tensor.

        def sparse(i):
            devs = ms[i].devices
            out[i] = ms[i].sparse_all_reduce(
                [np.ones((d + 1, 1), np.float32) for d in devs],
                [np.full(d + 1, d % 3, np.int64) for d in devs], (3, 1), axes=["data"],
                timeout_ms=10000)
        threads = [threading.Thread(target=sparse, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        want = {0: [[1.0], [0.0], [3.0]], 1: [[4.0], [2.0], [0.0]]}  # groups {0,2} and {1,3}
        for i in range(2):
            assert len(out[i]) == 2
            for j, g in enumerate(out[i]):
                assert g.path == "dense"  # a worker brings d+1 rows: the counts differ
                np.testing.assert_array_equal(g.dense(), want[j])
        # A save of both workers, then restore() without a step: the two workers
        # (four devices) agree on it and each device gets its own shard back.
        for h in [m.save(7) for m in ms]:
            h.wait(timeout=30)
        for m in ms:
            for d in m.devices:
                m.attach("w", (4, 4), "float32", ["data", "model"], device=d)[:] = -1
        restored = [None, None]
        threads = [threading.Thread(target=lambda i=i: restored.__setitem__(i, ms[i].restore()))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert restored == [7, 7]
        for m in ms:
            for d in m.devices:
                np.testing.assert_array_equal(m.read("w", device=d), np.full((2, 2), float(d)))
