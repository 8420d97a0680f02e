#!/usr/bin/python3
"""One trainer of bench/memory_tier.py, next to its worker (TESSERA_WORKER), driven
by JSON commands on stdin, one per line, each answered by one JSON line on stdout.

    memory_tier_trainer.py state MESH RANK WORLD MIB SEED [TENSORS FROZEN]
        attaches MIB MiB of float32 state (TENSORS tensors, 4 by default, sharded over
        `data`; the first FROZEN of them, 0 by default, never written after "fill": a
        frozen base, the others its adapters), answers
        {"ready": ..., "start_s", "attach_ms"}, then serves the commands:
          {"op": "memcpy", "reps": N}        np.copyto of the whole state into a private
                                             buffer, warmed by two copies first: ms of each
          {"op": "step", "step": S, "tier": "memory"|"disk", "opts": {...}}
                                             stamps the state with S, save(S, ...) and
                                             handle.wait(): save_ms, snapshot_ms, commit_ms
          {"op": "loop", "first_step": S, "steps": N, "step_ms": X, "checkpoint": "memory"|"none",
           "background": bool, "opts": {...}}
                                             N steps of a loop whose step is X ms of device
                                             time (a sleep: the host's CPUs are free, as while
                                             an accelerator computes) and then the optimizer's
                                             write into every page of the state; with
                                             "memory", a memory checkpoint after each step
                                             (background: save(background=True), the write
                                             waits for the snapshot): steps_per_s
          {"op": "scramble"}                 zeroes the state (a restore must write it back)
          {"op": "restore"}                  restore() of the latest: ms, step, tier, source
          {"op": "check", "step": S}         the state equals step S's
          {"op": "exit"}
    memory_tier_trainer.py train MESH RANK WORLD STEPS ROUNDS REDUNDANCY
        the model and loop of examples/python/train.py (4 ranks averaging gradients with
        all_reduce through their workers), ROUNDS rounds of STEPS steps alternating no
        checkpoint and a memory checkpoint after every step; prints the steps per second
        of each round.

The state of step S is a random base (a function of SEED and the rank) with every
1024th float (one per 4 KiB page) set to S.
"""

import json
import os
import sys
import time

T0 = time.monotonic()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("TESSERA_PYTHON", os.path.join(HERE, "..", "python")))
import numpy as np  # noqa: E402

import tessera  # noqa: E402

TENSORS = 4  # the state's tensors (argv may say otherwise), of which
FROZEN = 0   # the first FROZEN are never written after "fill"
STAMP = 1024  # floats between stamps: one per 4 KiB page


def reply(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def base(seed, rank, j, n):
    return np.random.default_rng(seed * 1009 + rank * 31 + j).random(n, dtype=np.float32)


def stamp(arrays, step, frozen=0):
    for a in arrays[frozen:]:
        a[::STAMP] = step


def equal(arrays, seed, rank, step):
    for j, a in enumerate(arrays):
        if j < FROZEN:
            continue
        want = base(seed, rank, j, a.size)
        want[::STAMP] = step
        if not np.array_equal(a, want):
            return False
    return True


def serve_state(mesh, rank, world, mib, seed):
    n = int(mib * (1 << 20) / 4 / TENSORS)
    m = tessera.CheckpointManager(mesh, timeout=300)
    t = time.monotonic()
    arrays = [m.attach("t%d" % j, (world * n,), "float32", ("data",)) for j in range(TENSORS)]
    attach_ms = (time.monotonic() - t) * 1000
    reply(ready=True, rank=rank, pid=os.getpid(), start_s=time.monotonic() - T0,
          attach_ms=attach_ms, bytes=sum(a.nbytes for a in arrays))
    handles = []
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "fill":
                for j, a in enumerate(arrays):
                    a[:] = base(seed, rank, j, a.size)
                stamp(arrays, cmd["step"])
                reply(ok=True)
            elif op == "memcpy":
                dst = [np.empty_like(a) for a in arrays]
                for _ in range(2):
                    for d, a in zip(dst, arrays):
                        np.copyto(d, a)
                ms = []
                for _ in range(cmd.get("reps", 10)):
                    t = time.perf_counter()
                    for d, a in zip(dst, arrays):
                        np.copyto(d, a)
                    ms.append((time.perf_counter() - t) * 1000)
                del dst
                reply(ok=True, memcpy_ms=ms)
            elif op == "step":
                step = cmd["step"]
                stamp(arrays, step, FROZEN)
                t = time.perf_counter()
                if cmd.get("tier", "memory") == "memory":
                    h = m.save(step, tier="memory", **cmd.get("opts", {}))
                else:
                    h = m.save(step)
                save_ms = (time.perf_counter() - t) * 1000
                out = {"ok": True, "save_ms": save_ms, "snapshot_ms": h.snapshot_ms,
                       "snapshot_bytes": h.snapshot_bytes}
                if cmd.get("wait", True):
                    h.wait(timeout=300)
                    out["commit_ms"] = (time.perf_counter() - t) * 1000
                    out["committed"] = True
                else:
                    handles.append(h)
                reply(**out)
            elif op == "loop":
                reply(ok=True, **loop(m, arrays, cmd))
            elif op == "scramble":
                for a in arrays:
                    a[:] = 0
                reply(ok=True)
            elif op == "restore":
                t = time.perf_counter()
                r = m.restore(timeout=cmd.get("timeout", 600))
                ms = (time.perf_counter() - t) * 1000
                if r is None:
                    reply(ok=True, restore_ms=ms, step=None)
                else:
                    reply(ok=True, restore_ms=ms, step=int(r), tier=r.tier, source=r.source,
                          fallback=r.fallback)
            elif op == "check":
                reply(ok=True, equal=equal(arrays, seed, rank, cmd["step"]))
            elif op == "exit":
                reply(ok=True)
                break
            else:
                reply(ok=False, error="unknown op %s" % op)
        except tessera.TesseraError as e:
            reply(ok=False, error=e.code, message=str(e), details=e.details)
    m.close()


def loop(m, arrays, cmd):
    first, steps, step_s = cmd["first_step"], cmd["steps"], cmd["step_ms"] / 1000
    memory, background = cmd["checkpoint"] == "memory", cmd.get("background", False)
    handles, snapshotting = [], None
    t = time.perf_counter()
    for i in range(steps):
        time.sleep(step_s)  # the accelerator's forward and backward
        if snapshotting is not None:
            snapshotting.snapshotted()  # the optimizer writes the state: the snapshot is taken
        stamp(arrays, first + i, FROZEN)
        if memory:
            h = m.save(first + i, tier="memory", background=background, **cmd.get("opts", {}))
            snapshotting = h if background else None
            handles.append(h)
    elapsed = time.perf_counter() - t
    if handles:  # the last one committed: every earlier step did (they commit in order)
        handles[-1].wait(timeout=300)
    return {"steps": steps, "s": elapsed, "steps_per_s": steps / elapsed}


def train(mesh, rank, world, steps, rounds, redundancy):
    sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
    import torch  # noqa: PLC0415
    import train as example  # noqa: PLC0415 - examples/python/train.py
    torch.set_num_threads(1)
    seed, size, lr = 1234, 16, 0.01
    model = example.build_model(seed)
    optim = torch.optim.Adam(model.parameters(), lr=lr)
    tessera.init_optimizer_state(optim)
    params = list(model.parameters())
    state_bytes = sum(p.numel() * 4 for p in params) * 3  # the parameters and Adam's two moments
    out = {"rank": rank, "rounds": [], "state_bytes": state_bytes}
    with tessera.CheckpointManager(mesh, timeout=120) as ckpt:
        ckpt.attach_state_dict({"model": model, "optim": optim})
        ckpt.barrier("start", timeout_ms=120000)
        step = 0
        handles = []

        def one_step(save):
            nonlocal step
            step += 1
            x, y = example.batch(seed, step, rank, size)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optim.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
            ckpt.all_reduce(flat, reduce="mean", timeout_ms=30000, out=flat)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            optim.step()
            if save:
                handles.append(ckpt.save(step, tier="memory", redundancy=redundancy))

        for _ in range(20):  # warm-up
            one_step(False)
        for r in range(rounds):
            save = r % 2 == 1
            ckpt.barrier("round-%d" % r, timeout_ms=120000)
            t = time.perf_counter()
            for _ in range(steps):
                one_step(save)
            elapsed = time.perf_counter() - t
            committed = None
            if handles:  # the last one committed: every earlier step did (they commit in order)
                handles[-1].wait(timeout=300)
                committed = handles[-1].step
            handles.clear()
            out["rounds"].append({"round": r, "checkpoint": "memory" if save else "none",
                                  "steps": steps, "s": elapsed, "steps_per_s": steps / elapsed,
                                  "last_committed": committed})
    print(json.dumps(out))


def main():
    kind = sys.argv[1]
    if kind == "state":
        mesh, rank, world, mib, seed = sys.argv[2:7]
        global TENSORS, FROZEN  # noqa: PLW0603 - the state's shape, set once
        if len(sys.argv) > 8:
            TENSORS, FROZEN = int(sys.argv[7]), int(sys.argv[8])
        serve_state(mesh, int(rank), int(world), float(mib), int(seed))
    elif kind == "train":
        mesh, rank, world, steps, rounds, redundancy = sys.argv[2:8]
        train(mesh, int(rank), int(world), int(steps), int(rounds), redundancy)
    else:
        raise SystemExit("usage: see the docstring")


if __name__ == "__main__":
    main()
