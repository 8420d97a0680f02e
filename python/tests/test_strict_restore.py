"""restore() is strict, as load_state_dict(strict=True): attached tensors the
checkpoint lacks, or checkpoint tensors nobody attached, refuse it before a byte is
written; strict=False restores the tensors both have. Names do not depend on a DDP
or DataParallel wrapper, and an optimizer without state is initialized or refused."""

import socket

import numpy as np
import pytest
import torch

import tessera


@pytest.fixture
def solo(cluster, client, mesh_name):
    """A one-worker mesh {data: 1} on worker 0, and a factory of managers on it."""
    client.register_mesh(mesh_name, {"data": 1}, workers=cluster.worker_ids[:1])
    opened = []

    def manager():
        m = tessera.CheckpointManager(mesh_name, worker=cluster.worker_urls[0], timeout=30)
        opened.append(m)
        return m
    yield manager
    for m in opened:
        m.close()


def test_attached_but_not_saved_is_missing_and_nothing_is_written(solo):
    m = solo()
    a = m.attach("a", (4,), "float32")
    a[:] = 1
    m.save(1).wait(timeout=30)
    b = m.attach("b", (3,), "float32")  # attached after the save
    a[:] = 7
    b[:] = 8
    with pytest.raises(tessera.TesseraError) as e:
        m.restore(1)
    err = e.value
    assert err.code == "conflict" and err.status == 409, repr(err)
    assert err.details["missing"] == ["b"] and err.details["unexpected"] == []
    assert err.details["step"] == 1 and err.details["worker"] == m.worker_id
    assert "1 attached but not in the checkpoint (b)" in str(err)
    np.testing.assert_array_equal(a, [7] * 4)  # nothing restored, not even 'a'
    np.testing.assert_array_equal(b, [8] * 3)

    restored = m.restore(1, strict=False)
    assert restored == 1 and restored.missing == ["b"] and restored.unexpected == []
    assert restored.tensors == ["a"]
    np.testing.assert_array_equal(a, [1] * 4)
    np.testing.assert_array_equal(b, [8] * 3)  # untouched


def test_saved_but_not_attached_is_unexpected_and_not_created(solo):
    m = solo()
    m.attach("a", (4,), "float32")[:] = 2
    m.attach("old", (2,), "int64")[:] = 5
    m.save(1).wait(timeout=30)
    m.detach("old")
    with pytest.raises(tessera.TesseraError) as e:
        m.restore(1)
    assert e.value.details["unexpected"] == ["old"] and e.value.details["missing"] == []
    restored = m.restore(1, strict=False)
    assert restored.unexpected == ["old"] and restored.tensors == ["a"]
    assert [t["name"] for t in m.tensors()] == ["a"]  # the worker holds no "old" again


def test_another_dtype_or_shape_refuses_even_when_not_strict(solo):
    m = solo()
    m.attach("a", (4,), "float32")
    m.attach("b", (2,), "float32")
    m.save(1).wait(timeout=30)
    m.detach("a")
    m.attach("a", (5,), "float32")[:] = 3
    for strict in (True, False):
        with pytest.raises(tessera.TesseraError) as e:
            m.restore(1, strict=strict)
        err = e.value
        assert err.code == "conflict" and err.details["tensor"] == "a", repr(err)
        assert err.details["mismatched"][0]["tensor"] == "a"
        assert "float32[4]" in str(err) and "float32[5]" in str(err)


def test_named_tensors_must_be_in_the_checkpoint(solo):
    m = solo()
    m.attach("a", (4,), "float32")[:] = 4
    m.save(1).wait(timeout=30)
    m.attach("b", (2,), "float32")
    with pytest.raises(tessera.TesseraError) as e:
        m.restore(1, tensors=["a", "b"])
    assert e.value.details["missing"] == ["b"]
    assert m.restore(1, tensors=["a"]).tensors == ["a"]  # "b" not asked for: not missing


def test_names_that_differ_by_module_prefix_get_a_hint(solo):
    m = solo()
    m.attach("model/module.fc.weight", (2,), "float32")
    m.save(1).wait(timeout=30)
    m.detach("model/module.fc.weight")
    m.attach("model/fc.weight", (2,), "float32")
    with pytest.raises(tessera.TesseraError) as e:
        m.restore(1)
    assert e.value.details["missing"] == ["model/fc.weight"]
    assert e.value.details["unexpected"] == ["model/module.fc.weight"]
    assert "'module.' prefix" in str(e.value)


def gpt_like(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.LayerNorm(8),
                               torch.nn.Linear(8, 16))


def step(model, optim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 16, (4, 5), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 16), x.roll(1, 1).reshape(-1))
    optim.zero_grad()
    loss.backward()
    optim.step()


@pytest.fixture(scope="module")
def process_group():
    """A gloo group of one process, so that DistributedDataParallel can wrap a model."""
    import torch.distributed as dist  # noqa: PLC0415
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def bits(t):
    return t.detach().clone().view(torch.int32 if t.dtype == torch.float32 else t.dtype)


def test_ddp_and_dataparallel_wrappers_attach_under_the_bare_names(solo, process_group):
    bare = gpt_like(0)
    names = {"model/" + k for k in bare.state_dict()}
    ddp = torch.nn.parallel.DistributedDataParallel(gpt_like(0))
    dp = torch.nn.DataParallel(gpt_like(0))
    for wrapped in (ddp, dp):
        assert {k for k in wrapped.state_dict()} != {k[6:] for k in names}  # "module." there
    m = solo()
    state = m.attach_state_dict({"model": ddp, "optim": torch.optim.AdamW(ddp.parameters())})
    assert {k for k in state if k.startswith("model/")} == names


def test_a_ddp_checkpoint_restores_into_the_bare_model_and_back(solo, process_group):
    ddp = torch.nn.parallel.DistributedDataParallel(gpt_like(1))
    optim = torch.optim.AdamW(ddp.parameters(), lr=0.01)
    with solo() as m:
        m.attach_state_dict({"model": ddp, "optim": optim})
        for s in range(3):
            step(ddp, optim, s)
        m.save(3).wait(timeout=30)
    saved = {k: bits(v) for k, v in ddp.module.state_dict().items()}

    bare = gpt_like(2)  # other values, same names
    bare_optim = torch.optim.AdamW(bare.parameters(), lr=0.01)
    with solo() as m:
        m.attach_state_dict({"model": bare, "optim": bare_optim})
        assert m.restore(3) == 3
        for k, v in bare.state_dict().items():
            assert torch.equal(bits(v), saved[k]), k
        assert float(bare_optim.state[bare_optim.param_groups[0]["params"][0]]["step"]) == 3
        step(bare, bare_optim, 3)
        m.save(4).wait(timeout=30)
    after = {k: bits(v) for k, v in bare.state_dict().items()}

    again = torch.nn.parallel.DistributedDataParallel(gpt_like(3))
    with solo() as m:
        m.attach_state_dict({"model": again,
                             "optim": torch.optim.AdamW(again.parameters(), lr=0.01)})
        assert m.restore(4) == 4
        for k, v in again.module.state_dict().items():
            assert torch.equal(bits(v), after[k]), k


def test_adam_without_state_is_initialized_at_attach(solo):
    model = gpt_like(4)
    optim = torch.optim.Adam(model.parameters())
    assert not optim.state
    state = solo().attach_state_dict({"model": model, "optim": optim})
    for i in range(3):
        assert "optim/state/%d/exp_avg" % i in state and "optim/state/%d/step" % i in state
    assert float(state["optim/state/0/step"]) == 0.0


def test_an_optimizer_without_state_that_tessera_cannot_make_is_refused(solo):
    model = gpt_like(5)
    optim = torch.optim.RMSprop(model.parameters())
    with pytest.raises(tessera.TesseraError) as e:
        solo().attach_state_dict({"model": model, "optim": optim})
    err = e.value
    assert err.code == "invalid_argument" and err.details["tensor"] == "optim", repr(err)
    assert "RMSprop" in str(err) and "optimizer step" in str(err)
    step(model, optim, 0)  # one step creates it; then it attaches
    state = solo().attach_state_dict({"model": model, "optim": optim})
    assert "optim/state/0/square_avg" in state

