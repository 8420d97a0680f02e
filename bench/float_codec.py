#!/usr/bin/python3
"""The float codec (docs/format.md, "Codec and checksum") against python3-blosc (shuffle
and bitshuffle, with zstd at the same level) and plain zstd-1, on the same bytes, one
core each, in one run.

Data: N(0, 0.02) float32 (--mib MiB), and its bfloat16 and float16 roundings; the
examples/python model (train.py's build_model, Adam, its batch()) trained for --steps
steps, weights and Adam moments as they are (a few KiB), and the same architecture
widened to about --mib MiB of weights and moments, trained the same way.

Ours: build-bench/bin/tessera_bench_codec (EncodeChunk / DecodeChunk over 4 MiB chunks
as the shard writer calls them, checksums included). blosc: blosc.compress with typesize
the element width, clevel 1, cname zstd, one thread. Each timed --reps times.

    /usr/bin/python3 bench/float_codec.py [--out bench/out/float_codec.jsonl] [--quick]

Rows are JSON lines of --out; bench/report.py's "The float codec" section reads them
(`markdown(rows)` here).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RATIO_GOAL = {"float32": 1.12, "bfloat16": 1.40}
COMPRESS_MBPS = 1000.0    # per core
DECOMPRESS_MBPS = 2000.0  # per core
WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}


def normal_state(mib):
    rng = np.random.default_rng(7)
    return rng.normal(0, 0.02, size=int(mib * (1 << 20)) // 4).astype(np.float32)


def trained_state(hidden, steps):
    """examples/python/train.py's model and loop (one rank, no checkpoints), `hidden`
    units wide (the example's is 32): weights, then Adam's two moments, float32."""
    import torch  # noqa: PLC0415 - only here
    sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
    import train  # noqa: PLC0415
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    model = train.build_model(1234) if hidden == 32 else torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(1, steps + 1):
        x, y = train.batch(1234, step, 0, 16)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
    parts = [p.detach().reshape(-1) for p in model.parameters()]
    for p in model.parameters():
        st = optim.state[p]
        parts += [st["exp_avg"].reshape(-1), st["exp_avg_sq"].reshape(-1)]
    return torch.cat(parts).numpy().astype(np.float32)


def as_dtype(f32, dtype):
    if dtype == "float32":
        return f32.tobytes()
    if dtype == "float16":
        return f32.astype(np.float16).tobytes()
    import torch  # noqa: PLC0415
    return torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().tobytes()


def ours(binary, data, dtype, reps):
    with tempfile.NamedTemporaryFile(suffix=".raw") as f:
        f.write(data)
        f.flush()
        out = subprocess.run([binary, "--input", f.name, "--dtype", dtype, "--reps", str(reps)],
                             check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def blosc_rows(data, dtype, reps):
    import blosc  # noqa: PLC0415 - python3-blosc, the peer
    blosc.set_nthreads(1)
    rows = []
    for name, shuffle in (("blosc-shuffle", blosc.SHUFFLE), ("blosc-bitshuffle", blosc.BITSHUFFLE)):
        comp, decomp, packed, equal = [], [], b"", True
        for _ in range(reps):
            t0 = time.perf_counter()
            packed = blosc.compress(data, typesize=WIDTH[dtype], clevel=1, shuffle=shuffle, cname="zstd")
            comp.append(len(data) / (time.perf_counter() - t0) / 1e6)
            t0 = time.perf_counter()
            back = blosc.decompress(packed)
            decomp.append(len(data) / (time.perf_counter() - t0) / 1e6)
            equal = equal and back == data
        rows.append({"codec": name, "dtype": dtype, "raw_bytes": len(data), "stored_bytes": len(packed),
                     "ratio": len(data) / len(packed), "compress_mbps": comp, "decompress_mbps": decomp,
                     "equal": equal})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "out", "float_codec.jsonl"))
    p.add_argument("--bin", default=os.path.join(ROOT, os.environ.get("TESSERA_BIN", "build-bench/bin")))
    p.add_argument("--mib", type=float, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="8 MiB, 2 reps")
    a = p.parse_args()
    if a.quick:
        a.mib, a.reps = 8, 2
    binary = os.path.join(a.bin, "tessera_bench_codec")
    run = int(time.time())
    f32_normal = normal_state(a.mib)
    # widened so that weights and moments are about --mib MiB: 3 x 4 bytes x (10 h + 1)
    hidden = max(32, int(a.mib * (1 << 20) / 120))
    sets = [("N(0, 0.02)", f32_normal), ("examples/python model, trained", trained_state(32, a.steps)),
            ("examples/python model widened to %d units, trained" % hidden, trained_state(hidden, a.steps))]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "a") as out:
        for name, f32 in sets:
            for dtype in ("float32", "bfloat16", "float16"):
                data = as_dtype(f32, dtype)
                for row in ours(binary, data, dtype, a.reps) + blosc_rows(data, dtype, a.reps):
                    row = dict(row, bench="float_codec", data=name, run=run)
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")
    return 0


def _med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def markdown(rows):
    """The "The float codec" section of bench/RESULTS.md from `rows`."""
    rows = [r for r in rows if r.get("bench") == "float_codec"]
    runs = sorted({r["run"] for r in rows})
    L = ["## The float codec (bench/float_codec.py)", "",
         "Each chunk of a float32, bfloat16 or float16 tensor is split into byte planes, each "
         "plane an entropy-coded zstd frame (zstd's fastest level, Huffman-coded literals) or raw "
         "(docs/format.md). Ours is the shard writer's "
         "EncodeChunk/DecodeChunk over 4 MiB chunks, xxh64 checksums included; the peers, on "
         "the same bytes in the same run: python3-blosc (shuffle and bitshuffle, zstd, clevel "
         "1) and plain zstd-1 (the same libzstd). One core each; speeds are MB/s of raw "
         "bytes, medians over %d run(s) × reps (spread min–max). Ratio = raw / stored." % len(runs), "",
         "| data | dtype | ours: ratio | compress MB/s | decompress MB/s | blosc shuffle+zstd: ratio "
         "(compress, decompress MB/s) | blosc bitshuffle+zstd: ratio (compress, decompress) | zstd-1: "
         "ratio (compress, decompress) | goal | verdict |",
         "|---|---|---:|---:|---:|---|---|---|---|---|"]

    def pick(data, dtype, codec):
        return [r for r in rows if r["data"] == data and r["dtype"] == dtype and r["codec"] == codec]

    def speeds(rs, key):
        return [x for r in rs for x in r[key]]

    def brief(rs):
        if not rs:
            return "—"
        return "%.3f (%.0f, %.0f)" % (_med([r["ratio"] for r in rs]), _med(speeds(rs, "compress_mbps")),
                                      _med(speeds(rs, "decompress_mbps")))

    datas = []
    for r in rows:
        if r["data"] not in datas:
            datas.append(r["data"])
    for data in datas:
        for dtype in ("float32", "bfloat16", "float16"):
            o = pick(data, dtype, "tessera")
            if not o:
                continue
            ratio = _med([r["ratio"] for r in o])
            comp, decomp = speeds(o, "compress_mbps"), speeds(o, "decompress_mbps")
            goal = RATIO_GOAL.get(dtype)
            big = o[0]["raw_bytes"] >= (1 << 20)
            met = (goal is None or ratio >= goal) and (not big or (_med(comp) >= COMPRESS_MBPS
                                                                    and _med(decomp) >= DECOMPRESS_MBPS))
            goal_text = ("ratio ≥ %.2f×" % goal if goal else "(no ratio goal)") + (
                ", ≥ %.0f / %.0f MB/s" % (COMPRESS_MBPS, DECOMPRESS_MBPS) if big else " (too small to time)")
            L.append("| %s (%s) | %s | %.3f | %.0f (%.0f–%.0f) | %.0f (%.0f–%.0f) | %s | %s | %s | %s | %s |" % (
                data, _size(o[0]["raw_bytes"]), dtype, ratio, _med(comp), min(comp), max(comp), _med(decomp),
                min(decomp), max(decomp), brief(pick(data, dtype, "blosc-shuffle")),
                brief(pick(data, dtype, "blosc-bitshuffle")), brief(pick(data, dtype, "zstd")), goal_text,
                "met" if met else "**not met**"))
    bad = [r for r in rows if not r.get("equal")]
    L += ["", "Every codec read back its bytes bit for bit." if not bad else
          "**%d row(s) did not read back their bytes bit for bit.**" % len(bad)]
    return L


def _size(n):
    return "%.1f MiB" % (n / (1 << 20)) if n >= (1 << 20) else "%d bytes" % n


if __name__ == "__main__":
    sys.exit(main())
