"""attach_state_dict(): a module and its optimizer train in mapped memory."""

import numpy as np
import pytest
import torch

import tessera


def small_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 1))
    optim = torch.optim.Adam(model.parameters(), lr=0.05)
    return model, optim


def train(model, optim, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()


def as_bits(t):
    return t.detach().clone().view(torch.int32 if t.dtype == torch.float32 else t.dtype)


@pytest.fixture
def one(cluster, client, mesh_name):
    """A one-worker mesh {data: 1} (so that one trainer saves alone) and its manager."""
    client.register_mesh(mesh_name, {"data": 1}, workers=cluster.worker_ids[:1])
    with tessera.CheckpointManager(mesh_name, worker=cluster.worker_urls[0]) as m:
        yield m


def test_params_buffers_and_adam_state_live_in_mapped_memory(one):
    m = one
    model, optim = small_model(0)
    tessera.init_optimizer_state(optim)
    params_before = [id(p) for p in model.parameters()]
    state = m.attach_state_dict({"model": model, "optim": optim})
    assert [id(p) for p in model.parameters()] == params_before  # same objects, new memory
    assert "model/0.weight" in state and "model/1.running_mean" in state
    assert "optim/state/0/exp_avg" in state and "optim/state/0/step" in state
    held = {t["name"] for t in m.tensors()}
    assert set(state) <= held

    # Train: the optimizer, autograd and batch norm write straight into the mapping.
    train(model, optim, 5, seed=1)
    for name in ("model/0.weight", "model/1.running_var", "optim/state/3/exp_avg_sq",
                 "optim/state/0/step"):
        np.testing.assert_array_equal(m.read(name), state[name].detach().numpy(), err_msg=name)
    assert float(state["optim/state/0/step"]) == 5.0

    # Save here, train on, restore: the module is back at the saved values, bit for bit.
    m.save(5).wait(timeout=30)
    saved = {k: as_bits(v) for k, v in state.items()}
    train(model, optim, 3, seed=2)
    after_8 = as_bits(state["model/3.weight"])
    assert not torch.equal(as_bits(state["model/0.weight"]), saved["model/0.weight"])
    assert m.restore(5) == 5
    for k, v in state.items():
        assert torch.equal(as_bits(v), saved[k]), k
    # Training on from the restored state repeats the same steps bit for bit, and
    # equals training that never left ordinary memory.
    train(model, optim, 3, seed=2)
    assert torch.equal(as_bits(state["model/3.weight"]), after_8)
    plain, plain_optim = small_model(0)
    train(plain, plain_optim, 5, seed=1)
    train(plain, plain_optim, 3, seed=2)
    assert torch.equal(as_bits(plain[3].weight), after_8)


def test_layouts_sharded_and_errors(cluster, client, mesh_name):
    client.register_mesh(mesh_name, {"data": 4}, workers=cluster.worker_ids)
    ms = [tessera.CheckpointManager(mesh_name, worker=u, axes={"data": 4})
          for u in cluster.worker_urls]
    try:
        # A sharded entry: the tensor given is this device's shard of the global one.
        shard = torch.full((2, 3), 7.0)
        state = ms[1].attach_state_dict({"emb": shard}, layouts={"emb": ["data", None]})
        assert ms[1].tensors()[0]["shape"] == [8, 3]
        assert state["emb"] is shard
        shard.add_(1)
        np.testing.assert_array_equal(ms[1].read("emb"), np.full((2, 3), 8.0))

        no_axes = tessera.CheckpointManager(mesh_name, worker=cluster.worker_urls[2])
        with pytest.raises(tessera.TesseraError) as e:
            no_axes.attach_state_dict({"emb": torch.zeros(2, 3)}, layouts={"emb": ["data", None]})
        assert e.value.details == {"field": "axes", "tensor": "emb"}
        with pytest.raises(tessera.TesseraError) as e:
            ms[2].attach_state_dict({"w": torch.zeros(2)}, layouts={"v": None})
        assert e.value.details["tensor"] == "v"
        with pytest.raises(tessera.TesseraError) as e:
            ms[2].attach_state_dict({"model": {"lr": 0.1}})
        assert e.value.details["tensor"] == "model/lr"
        with pytest.raises(tessera.TesseraError) as e:
            tessera.init_optimizer_state(torch.optim.RMSprop([torch.zeros(2)]))
        assert e.value.details["field"] == "optimizer"
    finally:
        for m in ms:
            m.close()
