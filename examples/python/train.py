"""Data-parallel training of a small torch model with Tessera checkpoints.

One process per rank, each next to its own tessera-worker (TESSERA_WORKER), all
on mesh {data: WORLD}:
- the parameters and the Adam state are replicated and live in the worker's
  shared memory (attach_state_dict), so a save snapshots them without a copy
  through the trainer;
- gradients are averaged with an all-reduce through the workers;
- every --save-every steps the loop calls save(step) and goes on at once;
- at start it restores the latest committed step, if any (restore() agrees on
  it across the ranks' workers), and resumes after it.

Everything is a function of (seed, step, rank), and torch runs on one thread, so
a run that is killed and resumed logs the same losses, bit for bit, as one that
never stopped. Each rank appends "step N loss HEX global HEX" lines to
<log-dir>/rank-R.log (float.hex: exact).

    TESSERA_WORKER=http://127.0.0.1:PORT python3 train.py --rank 0 --mesh train --log-dir logs
"""

import argparse
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import tessera  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    p.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "4")))
    p.add_argument("--worker", default=None, help="local API of this rank's worker "
                   "(default: env TESSERA_WORKER)")
    p.add_argument("--mesh", default="train")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--log-dir", default=".")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--timeout-ms", type=int, default=3000,
                   help="how long an in-loop all-reduce waits for the other ranks")
    p.add_argument("--start-timeout-ms", type=int, default=60000,
                   help="how long the first collective waits (ranks start at different times)")
    p.add_argument("--step-delay-ms", type=int, default=0, help="sleep per step (pacing)")
    p.add_argument("--crash-after-save", type=int, default=None, metavar="STEP",
                   help="fault injection: SIGKILL this process as soon as save(STEP) returned")
    return p.parse_args(argv)


def build_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def batch(seed, step, rank, size):
    """This rank's data at this step: a pure function of (seed, step, rank)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    x = torch.randn(size, 8, generator=g)
    y = torch.sin(x[:, :4].sum(1, keepdim=True)) + 0.1 * x[:, 4:].prod(1, keepdim=True)
    return x, y


def main(argv=None):
    args = parse_args(argv)
    try:
        return train(args)
    except tessera.TesseraError as e:
        print("rank %d: %s: %s %s" % (args.rank, e.code, e, e.details), file=sys.stderr)
        return 3


def train(args):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, "rank-%d.log" % args.rank), "a", buffering=1)

    model = build_model(args.seed)
    optim = torch.optim.Adam(model.parameters(), lr=args.lr)
    tessera.init_optimizer_state(optim)  # Adam's state exists before the first step
    params = list(model.parameters())

    with tessera.CheckpointManager(args.mesh, worker=args.worker) as ckpt:
        ckpt.attach_state_dict({"model": model, "optim": optim})

        # Resume: every rank's worker agrees on the newest step they all saw committed.
        restored = ckpt.restore()
        start = 1
        if restored is not None:
            start = restored + 1
            log.write("resume from %d\n" % restored)
        # From here on a rank that does not arrive within --timeout-ms is a failure.
        ckpt.barrier("start-%d" % start, timeout_ms=args.start_timeout_ms)

        for step in range(start, args.steps + 1):
            x, y = batch(args.seed, step, args.rank, args.batch)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optim.zero_grad()
            loss.backward()
            # One all-reduce per step: every gradient, and the loss, averaged over ranks.
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
            ckpt.all_reduce(flat, reduce="mean", timeout_ms=args.timeout_ms, out=flat)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            optim.step()
            log.write("step %d loss %s global %s\n" % (step, float(loss).hex(),
                                                        float(flat[-1]).hex()))
            if step % args.save_every == 0:
                handle = ckpt.save(step, metadata={"rank0_loss": float(flat[-1])})
                log.write("saved %d in %.2f ms\n" % (step, handle.snapshot_ms))
                if args.crash_after_save == step:
                    os.kill(os.getpid(), signal.SIGKILL)
            if args.step_delay_ms:
                time.sleep(args.step_delay_ms / 1000.0)
        ckpt.wait_until_finished(timeout=60)
    log.write("done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
