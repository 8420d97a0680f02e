"""A small GPT trained under torch DistributedDataParallel, checkpointed by Tessera.

One process per rank (gloo on CPU), each next to its own tessera-worker
(TESSERA_WORKER), all on mesh {data: WORLD}. What Tessera adds to the loop:

    ckpt = tessera.CheckpointManager(mesh)
    ckpt.attach_state_dict({"model": ddp_model, "optim": optimizer})
    restored = ckpt.restore()                 # every rank: the same step, or None
    start = 1 if restored is None else restored + 1
    ...
    ckpt.save(step, metadata={...})           # returns once snapshotted

- attach_state_dict looks through the DDP wrapper (names without "module."),
  and creates AdamW's state before the first step, so a checkpoint of step 5
  holds the optimizer's moments too;
- restore() with no step agrees on the newest step every rank's worker saw
  committed; no broadcast of our own;
- the data position lives in the checkpoint's metadata, next to the config it
  was trained with, and is checked on resume.

Bit-exact resumes: DDP rebuilds its gradient buckets after each process's first
step, in the order the gradients became ready, which changes how gloo sums them
(one ulp here and there). --ddp-buckets fixed (the default) passes
find_unused_parameters=True, which keeps the first buckets for good, so a resumed
run logs the same losses as one that never stopped; --ddp-buckets rebuilt shows
the drift. Each rank appends "step N loss HEX" (float.hex) and, at the end,
"state SHA256 tokens N" (its model and optimizer, and the tokens trained on) to
<log-dir>/rank-R.log.

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=4 \\
    TESSERA_WORKER=http://127.0.0.1:PORT python3 ddp_train.py --mesh gpt --log-dir logs
"""

import argparse
import datetime
import hashlib
import math
import os
import signal
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import tessera  # noqa: E402

CONFIG = {"vocab": 64, "block": 16, "dim": 32, "heads": 2, "layers": 2}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mesh", default="gpt")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--log-dir", default=".")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ddp-buckets", choices=("fixed", "rebuilt"), default="fixed")
    p.add_argument("--die-at-step", type=int, default=None, metavar="STEP",
                   help="fault injection: SIGKILL this process after training step STEP")
    return p.parse_args(argv)


class GPT(torch.nn.Module):
    """Token and position embeddings, causal self-attention blocks, a tied head."""

    def __init__(self, vocab, block, dim, heads, layers):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.zeros(block, dim))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                             norm_first=True) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: attached once, under its first name
        torch.nn.init.normal_(self.tok.weight, std=0.02)
        mask = torch.triu(torch.full((block, block), -math.inf), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x, src_mask=self.mask[: idx.shape[1], : idx.shape[1]])
        return self.head(self.norm(x))


def batch(seed, step, rank, size, block, vocab):
    """This rank's sequences at this step: a pure function of (seed, step, rank).
    The data is a noisy counting pattern, so the loss goes down."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    start = torch.randint(0, vocab, (size, 1), generator=g)
    seq = (start + torch.arange(block + 1)) % vocab
    noise = torch.rand(size, block + 1, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, vocab, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def state_hash(model, optim):
    """SHA-256 over the model's and the optimizer's tensors, in a fixed order."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    for i, s in sorted(optim.state_dict()["state"].items()):
        for k, v in sorted(s.items()):
            h.update(("%d/%s" % (i, k)).encode())
            h.update(v.detach().contiguous().numpy().tobytes() if torch.is_tensor(v)
                     else repr(v).encode())
    return h.hexdigest()


def main(argv=None):
    args = parse_args(argv)
    rank = int(os.environ["RANK"])
    try:
        return train(args, rank)
    except tessera.TesseraError as e:
        print("rank %d: %s: %s %s" % (rank, e.code, e, e.details), file=sys.stderr)
        return 3


def train(args, rank):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, "rank-%d.log" % rank), "a", buffering=1)

    torch.manual_seed(args.seed)
    model = torch.nn.parallel.DistributedDataParallel(
        GPT(**CONFIG), find_unused_parameters=args.ddp_buckets == "fixed")
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    with tessera.CheckpointManager(args.mesh) as ckpt:
        ckpt.attach_state_dict({"model": model, "optim": optim})
        restored = ckpt.restore()  # every rank gets the same step, or None
        start, tokens = 1, 0
        if restored is not None:
            meta = restored.metadata
            if meta.get("config") != CONFIG:
                raise SystemExit("checkpoint %d was trained with %s, not %s"
                                 % (restored, meta.get("config"), CONFIG))
            start, tokens = restored + 1, meta["tokens"]
            log.write("resume from %d\n" % restored)

        for step in range(start, args.steps + 1):
            x, y = batch(args.seed, step, rank, args.batch, CONFIG["block"], CONFIG["vocab"])
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, CONFIG["vocab"]),
                                                     y.reshape(-1))
            optim.zero_grad()
            loss.backward()  # DDP averages the gradients over the ranks
            optim.step()
            tokens += x.numel() * dist.get_world_size()
            log.write("step %d loss %s\n" % (step, float(loss).hex()))
            if step % args.save_every == 0:
                handle = ckpt.save(step, metadata={"tokens": tokens, "config": CONFIG})
                log.write("saved %d in %.2f ms\n" % (step, handle.snapshot_ms))
            if args.die_at_step == step:
                os.kill(os.getpid(), signal.SIGKILL)
        ckpt.wait_until_finished(timeout=60)
    log.write("state %s tokens %d\n" % (state_hash(model.module, optim), tokens))
    log.write("done\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
