"""attach_state_dict and init_optimizer_state: torch state in mapped memory."""

import weakref
from collections import OrderedDict

from ._dtypes import torch_module
from .errors import invalid_argument


def _optimizer_params(optimizer):
    """The optimizer's parameters in state_dict() order (their indices there)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _unwrap(torch, module):
    """The module inside DistributedDataParallel, DataParallel and torch.compile's
    wrapper: names are then the same for a module and its wrapper, as torch's
    consume_prefix_in_state_dict_if_present makes them (without touching a
    submodule that is itself called "module")."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while True:
        if isinstance(module, wrappers):
            module = module.module
        elif isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):
            module = module._orig_mod  # torch.compile (torch >= 2)
        else:
            return module


def _prepare_optimizer(torch, name, optimizer):
    """Creates the lazily made state of Adam, AdamW and SGD with momentum (as their
    first step would, see init_optimizer_state); refuses another optimizer that
    has no state at all, which would attach nothing and restore nothing."""
    params = _optimizer_params(optimizer)
    without = sum(1 for p in params if not optimizer.state.get(p))
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)):
        if without:
            init_optimizer_state(optimizer)
    elif params and without == len(params):
        raise invalid_argument(
            "optimizer '%s' (%s) has no state yet: %s creates it on its first step, so "
            "attaching it now would save and restore nothing of it. Take one optimizer step "
            "before attach_state_dict (or leave a stateless optimizer out of the state)"
            % (name, type(optimizer).__name__, type(optimizer).__name__),
            field="state", tensor=name)


def _collect(torch, prefix, obj, out, seen):
    """Appends (name, tensor) for every tensor of obj to `out`, depth first."""
    if isinstance(obj, torch.nn.Module):
        for key, t in _unwrap(torch, obj).state_dict(keep_vars=True).items():
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))  # a tied weight is attached once, under its first name
                out.append((prefix + key, t))
    elif isinstance(obj, torch.optim.Optimizer):
        _prepare_optimizer(torch, prefix.rstrip("/"), obj)
        for index, p in enumerate(_optimizer_params(obj)):
            for key, value in obj.state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and id(value) not in seen:
                    seen.add(id(value))
                    out.append(("%sstate/%d/%s" % (prefix, index, key), value))
    elif isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            out.append((prefix.rstrip("/"), obj))
    elif hasattr(obj, "items"):
        for key, value in obj.items():
            _collect(torch, "%s%s/" % (prefix, key), value, out, seen)
    else:
        raise invalid_argument(
            "attach_state_dict takes modules, optimizers, tensors and dicts of them; '%s' is a %s"
            % (prefix.rstrip("/"), type(obj).__name__), field="state", tensor=prefix.rstrip("/"))


def _global_shape(manager, name, local_shape, layout):
    if layout is None or all(a in (None, "unsharded") for a in layout):
        return tuple(local_shape)
    if len(layout) != len(local_shape):
        raise invalid_argument("layout %s of tensor '%s' has %d entries for %d dimensions"
                               % (list(layout), name, len(layout), len(local_shape)),
                               field="layout", tensor=name)
    if manager.axes is None:
        raise invalid_argument(
            "tensor '%s' is sharded (%s): pass axes={axis: size, ...} to CheckpointManager so "
            "that its global shape can be known" % (name, list(layout)), field="axes",
            tensor=name)
    shape = []
    for size, axis in zip(local_shape, layout):
        if axis in (None, "unsharded"):
            shape.append(size)
        elif axis not in manager.axes:
            raise invalid_argument("layout of tensor '%s' names axis '%s', which mesh %s lacks"
                                   % (name, axis, manager.mesh), field="layout", tensor=name)
        else:
            shape.append(size * manager.axes[axis])
    return tuple(shape)


def attach_state_dict(manager, state, layouts, device):
    torch = torch_module()
    entries = []
    _collect(torch, "", state, entries, set())
    unknown = set(layouts) - {name for name, _ in entries}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid_argument("layouts names '%s', which the state does not hold" % name,
                               field="layouts", tensor=name)
    attached = OrderedDict()
    for name, t in entries:
        if t.device.type != "cpu":
            raise invalid_argument(
                "tensor '%s' is on %s: attach_state_dict re-points CPU tensors; copy GPU state "
                "into attach()ed tensors before each save instead" % (name, t.device),
                field="device", tensor=name)
        layout = layouts.get(name)
        shape = _global_shape(manager, name, t.shape, layout)
        mapped = manager.attach(name, shape, t.dtype, layout, device=device, like="torch")
        if tuple(mapped.shape) != tuple(t.shape):
            raise invalid_argument(
                "tensor '%s' has shape %s but its local shard under layout %s is %s"
                % (name, list(t.shape), layout, list(mapped.shape)), field="layout", tensor=name)
        with torch.no_grad():
            if mapped.data_ptr() != t.data_ptr():
                mapped.copy_(t)
                t.data = mapped  # same Python object (optimizers keep it), mapped storage
        attached[name] = t
        manager._repointed.append((weakref.ref(t), t.data_ptr()))
    return attached


def release_repointed(repointed):
    """At close: each tensor that attach_state_dict re-pointed at mapped memory,
    and that still lives there, gets a private copy of its values, so the model
    and the optimizer go on as ordinary tensors that no later attach can alias."""
    torch = torch_module()
    with torch.no_grad():
        for ref, ptr in repointed:
            t = ref()
            if t is not None and t.numel() and t.data_ptr() == ptr:
                t.data = t.data.clone()


def init_optimizer_state(optimizer):
    """Creates the state an optimizer would create on its first step, exactly as
    that step would (so the training that follows is bit-identical), for
    torch.optim.Adam, AdamW and SGD (momentum, dampening 0). Parameters that
    already have state are left alone. Other optimizers raise TesseraError: take
    one step instead."""
    torch = torch_module()
    kind = type(optimizer).__name__
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
                on_device = group.get("capturable") or group.get("fused")
                state["step"] = (torch.zeros((1,), dtype=torch.float32, device=p.device)
                                 if on_device else torch.tensor(0.0))
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format)
            elif isinstance(optimizer, torch.optim.SGD):
                if group.get("momentum", 0) == 0:
                    continue
                if group.get("dampening", 0) != 0:
                    raise invalid_argument(
                        "SGD with dampening creates its momentum from the first gradient: take "
                        "one step before attach_state_dict", field="optimizer")
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            else:
                del optimizer.state[p]
                raise invalid_argument(
                    "init_optimizer_state knows Adam, AdamW and SGD, not %s: take one step "
                    "before attach_state_dict" % kind, field="optimizer")
    return optimizer
