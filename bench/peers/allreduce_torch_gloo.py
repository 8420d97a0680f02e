#!/usr/bin/python3
"""Gloo collectives on loopback: all_reduce sweep, all_gather, broadcast, barrier.

N ranks are processes on one host (torch.multiprocessing), rendezvous over
tcp://127.0.0.1:PORT, Gloo pinned to the loopback interface. After warmup and one
barrier, ops run back to back; each iteration's time is the max over ranks;
we report the median. busbw follows the NCCL-tests convention:
  all_reduce busbw = algbw * 2(n-1)/n, all_gather busbw = algbw * (n-1)/n
  (bytes = total output), broadcast busbw = algbw.
Rank 0 prints one JSON object per line.

  /usr/bin/python3 bench/peers/allreduce_torch_gloo.py [--ranks 4] [--port 29511]
"""
import argparse, json, os, statistics, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MAX_BYTES = 64 << 20


def iters_for(nbytes):  # ~64 MiB of traffic per size, 5..200 iterations
    return max(5, min(200, MAX_BYTES // max(nbytes, 1)))


def measure(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    ts = torch.zeros(iters, dtype=torch.float64)
    dist.barrier()
    for i in range(iters):  # back to back, like NCCL-tests; no barrier skew in the timings
        t0 = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t0
    dist.all_reduce(ts, op=dist.ReduceOp.MAX)  # slowest rank per iteration
    return statistics.median(ts.tolist())


def emit(rank, op, n, nbytes, t, iters, bus_factor):
    if rank != 0:
        return
    algbw = nbytes / t / 1e9
    print(json.dumps({"bench": "torch_gloo", "op": op, "ranks": n, "bytes": nbytes,
                      "time_us": round(t * 1e6, 1), "algbw_GBps": round(algbw, 4),
                      "busbw_GBps": round(algbw * bus_factor, 4), "iters": iters,
                      "torch": torch.__version__}), flush=True)


def worker(rank, n, port):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=n)
    nbytes = 4
    while nbytes <= MAX_BYTES:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        it = iters_for(nbytes)
        emit(rank, "all_reduce", n, nbytes, measure(lambda: dist.all_reduce(x), it), it,
             2 * (n - 1) / n)
        nbytes *= 4
    for per_rank in (1 << 20, 16 << 20):
        x = torch.ones(per_rank // 4)
        out = [torch.empty_like(x) for _ in range(n)]
        it = iters_for(per_rank * n)
        emit(rank, "all_gather", n, per_rank * n,
             measure(lambda: dist.all_gather(out, x), it), it, (n - 1) / n)
        it = iters_for(per_rank)
        emit(rank, "broadcast", n, per_rank, measure(lambda: dist.broadcast(x, 0), it), it, 1.0)
    t = measure(dist.barrier, 500, warmup=20)
    if rank == 0:
        print(json.dumps({"bench": "torch_gloo", "op": "barrier", "ranks": n,
                          "time_us": round(t * 1e6, 1), "iters": 500}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--port", type=int, default=29511)
    a = ap.parse_args()
    mp.spawn(worker, args=(a.ranks, a.port), nprocs=a.ranks, join=True)
