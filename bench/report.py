#!/usr/bin/python3
"""Writes bench/RESULTS.md from the JSON lines of one bench/run.sh session.

Reads, in --out: fio_pass1.jsonl and fio_pass2.jsonl (bench/peers/disk_fio.sh),
torch.jsonl (bench/peers/save_torch.py), tessera.jsonl (tessera_bench_storage),
cluster.jsonl (tessera_bench_cluster), s3_cluster.jsonl and s3_boto3_<i>.jsonl (the
cluster on a Ceph RGW, and boto3's transfers to it), the collectives' gloo<i>.jsonl
(bench/peers/allreduce_torch_gloo.py), mpi<i>.jsonl (bench/peers/allreduce_mpi.sh),
ours<i>.jsonl and ours_inproc.jsonl (tessera_bench_collectives), rest_barrier.jsonl
(tessera_bench_rest_barrier), memory_tier.jsonl (bench/memory_tier.py: the memory tier
against a memcpy, the POSIX root, S3 and iperf3), float_codec.jsonl (bench/float_codec.py:
the float codec against python3-blosc and zstd-1), incremental.json (bench/incremental.py:
incremental saves against full ones), and steps.jsonl (wall time of every
step). Our figures
and the peers' come from the same session on the same machine, because this VM's disk
moves by up to 3x between runs (bench/peers/README.md) and only a same-session
ratio means anything. Medians are used wherever there are several runs; every run is
shown. With --only storage or --only collectives, only that part is reported.

This file is the driver: its arguments, the machine's facts, the assembly of RESULTS.md
in its order, and --section. Each section is made by its own module beside it:
session_report.py (the title and "When and where"), storage_report.py (the storage rows
of Targets and the storage sections), cluster_report.py, s3_report.py,
collectives_report.py, and the modules named in SECTIONS and in main(); report_common.py
holds what they share (load(), medians, ratios, verdicts and the formatting of figures).

  /usr/bin/python3 bench/report.py --out bench/out --results bench/RESULTS.md
  /usr/bin/python3 bench/report.py --section memory_tier   # only that section of RESULTS.md
  /usr/bin/python3 bench/report.py --section float_codec
  /usr/bin/python3 bench/report.py --section incremental
"""
import argparse
import json
import os
import platform
import sys

import cluster_report
import s3_report
import session_report
from collectives_report import Collectives
from report_common import load, sh
from storage_report import Storage


def machine_facts(out_dir):
    mem = sh("free -h | awk '/^Mem:/ {print $2 \" total, \" $7 \" available\"}'")
    df = sh(f"df -hT {out_dir} | tail -n 1").split()
    disk = (f"`{df[0]}`, {df[1]}, {df[2]} in size, {df[3]} used, {df[4]} available "
            f"(`df -hT` of bench/out)") if len(df) >= 5 else "unknown"
    cpu = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
    tpc = sh("lscpu | sed -n 's/^Thread(s) per core: *//p'")
    hyp = sh("lscpu | sed -n 's/^Hypervisor vendor: *//p'")
    return {
        "nproc": sh("nproc") or str(os.cpu_count()),
        "cpu": (cpu + (f", {tpc} thread per core" if tpc else "")
                + (f", {hyp} guest" if hyp else "")),
        "memory": mem,
        "kernel": platform.release(),
        "disk": disk,
        "os": sh(". /etc/os-release && echo $PRETTY_NAME"),
        "gcc": sh("g++ --version | head -n 1"),
        "fio": sh("fio --version"),
        "mpi": sh("mpirun --version 2>/dev/null | head -n 1"),
        "zstd": sh("pkg-config --modversion libzstd"),
        "python": sys.version.split()[0],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--results", default="bench/RESULTS.md")
    ap.add_argument("--started", default="")
    ap.add_argument("--finished", default="")
    ap.add_argument("--command", default="bash bench/run.sh")
    ap.add_argument("--scale", default="1.0")
    ap.add_argument("--repeat", default="2")
    ap.add_argument("--only", default="all",
                    choices=("all", "storage", "collectives", "s3", "history"))
    ap.add_argument("--rounds", default="2")
    ap.add_argument("--targets", default="",
                    help="the build step's targets, as run.sh built them (space-separated)")
    ap.add_argument("--peers", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "peers"),
        help="bench/peers, for the peers' reference runs in its results/")
    ap.add_argument("--section", choices=tuple(SECTIONS), default=None,
                    help="rewrite only this section of --results, from --out's rows, leaving "
                         "the rest of the file as it is (appended when it is not there yet)")
    a = ap.parse_args()
    if a.section:
        return rewrite_section(a.results, a.section, a.out)
    do_storage = a.only in ("all", "storage")
    do_coll = a.only in ("all", "collectives")

    storage = Storage(a.out)
    steps = load(os.path.join(a.out, "steps.jsonl"))
    if do_storage and not storage.ours:
        sys.exit(f"report.py: no results in {a.out}/tessera.jsonl")
    coll = Collectives(a.out, steps, a.peers) if do_coll else None
    if coll is not None and not coll.ours:
        sys.exit(f"report.py: no collectives results in {a.out}/ours*.jsonl")

    facts = machine_facts(a.out)
    L = []
    w = L.append

    torch_version = storage.torch_version
    if coll is not None:
        torch_version = coll.torch_version or torch_version
    session_report.write(w, a, facts, steps, storage.config, torch_version, do_storage, do_coll)

    # --- targets ---
    w("## Targets")
    w("")
    if do_storage:
        storage.write_targets_intro(w)
    if coll is not None:
        coll.write_targets_intro(w)
    w("| target | ours | peer | ratio | needed | verdict |")
    w("|---|---:|---:|---:|---:|---|")
    if do_storage:
        storage.write_target_rows(w)
    if coll is not None:
        for row in coll.target_rows():
            w(row)
    w("")
    if do_storage:
        storage.write_target_notes(w)

    # --- the storage engine alone, the cluster on a POSIX root and on S3 ---
    if do_storage:
        storage.write_details(w, steps)
        cluster_rows = load(os.path.join(a.out, "cluster.jsonl"))
        cluster_report.cluster_section(w, cluster_rows, storage.t_save, storage.t_cold,
                                       storage.t_warm, storage.engine())
        s3_report.s3_section(w, load(os.path.join(a.out, "s3_cluster.jsonl")),
                             load(os.path.join(a.out, "s3_boto3_1.jsonl")) +
                             load(os.path.join(a.out, "s3_boto3_2.jsonl")),
                             cluster_rows, [r for r in steps if r.get("step", "").startswith("s3")])

    if a.only == "s3":
        s3_report.s3_section(w, load(os.path.join(a.out, "s3_cluster.jsonl")),
                             load(os.path.join(a.out, "s3_boto3_1.jsonl")) +
                             load(os.path.join(a.out, "s3_boto3_2.jsonl")),
                             [], [r for r in steps if r.get("step", "").startswith("s3")])

    if coll is not None:
        coll.write(w)

    exports = os.path.join(a.out, "export.jsonl")
    if a.only in ("all", "storage") and os.path.exists(exports):
        import export  # noqa: PLC0415 - bench/, beside this script
        L.extend(export.markdown(load(exports)))
    losses = os.path.join(a.out, "worker_loss.jsonl")
    if a.only in ("all", "storage") and os.path.exists(losses):
        import worker_loss  # noqa: PLC0415 - bench/, beside this script
        L.extend(worker_loss.markdown(load(losses)))

    memory = os.path.join(a.out, "memory_tier.jsonl")
    if a.only in ("all", "storage") and os.path.exists(memory):
        import memory_tier  # noqa: PLC0415 - bench/, beside this script
        L.extend(memory_tier.markdown(load(memory)))

    codec = os.path.join(a.out, "float_codec.jsonl")
    if a.only in ("all", "storage") and os.path.exists(codec):
        import float_codec  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(float_codec.markdown(load(codec)))

    incremental = os.path.join(a.out, "incremental.json")
    if a.only in ("all", "storage") and os.path.exists(incremental):
        import incremental_report  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(incremental_report.markdown(load(incremental)))

    dcp_rows = os.path.join(a.out, "dcp.jsonl")
    if a.only in ("all", "storage") and os.path.exists(dcp_rows):
        import dcp_report  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(dcp_report.markdown(load(dcp_rows)))

    jax_rows = os.path.join(a.out, "jax_orbax.jsonl")
    if a.only in ("all", "storage") and os.path.exists(jax_rows):
        import jax_orbax_report  # noqa: PLC0415 - bench/, beside this script
        L.append("")
        L.extend(jax_orbax_report.markdown(load(jax_rows)))

    history = os.path.join(a.out, "job_history.json")
    if a.only in ("all", "history") and os.path.exists(history):
        import job_history  # noqa: PLC0415 - bench/, beside this script
        with open(history) as f:
            L.extend(job_history.markdown(json.load(f)))

    with open(a.results, "w") as f:
        f.write("\n".join(L))
    return 0


# section: (its heading in RESULTS.md, the bench/ module whose markdown(rows) makes it,
# the rows' file in --out)
SECTIONS = {"memory_tier": ("## The memory tier", "memory_tier", "memory_tier.jsonl"),
            "float_codec": ("## The float codec", "float_codec", "float_codec.jsonl"),
            # incremental.json is one JSON object on one line: load() reads it as one row.
            "incremental": ("## Incremental saves", "incremental_report", "incremental.json"),
            "dcp": ("## PyTorch DCP", "dcp_report", "dcp.jsonl"),
            "jax": ("## JAX and Orbax", "jax_orbax_report", "jax_orbax.jsonl")}


def rewrite_section(results, section, out_dir):
    """Replaces one section of `results` (from its heading to the next "## " heading)
    with the one made from out_dir's rows; appends it when the file has none."""
    import importlib  # noqa: PLC0415
    head, module, jsonl = SECTIONS[section]
    rows = load(os.path.join(out_dir, jsonl))
    if not rows:
        sys.exit(f"report.py: no rows in {out_dir}/{jsonl}")
    new = importlib.import_module(module).markdown(rows)
    while new and not new[0].strip():
        new = new[1:]
    with open(results) as f:
        lines = f.read().split("\n")
    start = next((i for i, x in enumerate(lines) if x.startswith(head)), None)
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += [""] + new
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        tail = lines[end:]
        body = new + ([""] if tail else [])
        lines = lines[:start] + body + tail
    text = "\n".join(lines)
    with open(results, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
