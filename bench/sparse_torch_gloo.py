#!/usr/bin/python3
"""torch Gloo's sparse all_reduce on loopback, the peer of tessera_bench_collectives'
sparse_all_reduce lines.

The workload is theirs: an embedding gradient, rows of a [65536, 64] float32
tensor at uniform random indices (ones, so that the sum is exact), every rank
4096 rows ("equal") or rank r 2048*(r+1) rows ("unequal"), as a torch sparse COO
tensor given to dist.all_reduce (Gloo all-gathers the ranks' indices and
values and sums them). Method of bench/peers/allreduce_torch_gloo.py: N ranks
are processes on one host, Gloo pinned to loopback, 2 warmup ops, a barrier,
then 20 ops back to back, each iteration's time the max over ranks, the median
reported. The input is rebuilt before each op, outside the timed region; the
result is checked against the dense sum once, untimed. Rank 0 prints one JSON
object per line.

  /usr/bin/python3 bench/sparse_torch_gloo.py [--ranks 4] [--port 29521]
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DENSE_ROWS, WIDTH, ITERS = 65536, 64, 20
CASES = {"equal": lambda r: 4096, "unequal": lambda r: 2048 * (r + 1)}


def indices_of(rank, rows):
    g = torch.Generator().manual_seed(rank + 1)
    return torch.randint(0, DENSE_ROWS, (rows,), generator=g, dtype=torch.int64)


def sparse_input(rank, rows):
    return torch.sparse_coo_tensor(indices_of(rank, rows).unsqueeze(0),
                                   torch.ones(rows, WIDTH), (DENSE_ROWS, WIDTH))


def worker(rank, n, port):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    for case, rows_of in CASES.items():
        rows = rows_of(rank)
        for _ in range(2):
            dist.all_reduce(sparse_input(rank, rows))
        ts = torch.zeros(ITERS, dtype=torch.float64)
        dist.barrier()
        out = None
        for i in range(ITERS):
            x = sparse_input(rank, rows)
            t0 = time.perf_counter()
            dist.all_reduce(x)
            ts[i] = time.perf_counter() - t0
            out = x
        dist.all_reduce(ts, op=dist.ReduceOp.MAX)
        want = torch.zeros(DENSE_ROWS)
        for r in range(n):
            want.index_add_(0, indices_of(r, rows_of(r)), torch.ones(rows_of(r)))
        got = out.to_dense()[:, 0]
        if not torch.equal(got, want):
            raise SystemExit(f"rank {rank}: Gloo's sparse all_reduce ({case}) gave a wrong sum")
        if rank == 0:
            print(json.dumps({"bench": "torch_gloo", "op": "sparse_all_reduce", "case": case,
                              "ranks": n, "dense_shape": [DENSE_ROWS, WIDTH],
                              "rows": [rows_of(r) for r in range(n)],
                              "time_us": round(statistics.median(ts.tolist()) * 1e6, 1),
                              "iters": ITERS, "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--port", type=int, default=29521)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.ranks, a.port), nprocs=a.ranks, join=True)
