"""bench/memory_tier.py's section of bench/RESULTS.md ("The memory tier"): markdown(rows) of
memory_tier.jsonl's rows, each figure beside its comparison from the same run and the
issue's goal. Standard library only, for bench/report.py."""

import statistics

# Goals (the issue's).
STALL_VS_MEMCPY = 1.2      # memory save() stall ≤ 1.2× a memcpy of the same bytes
RAM_VS_S3 = 5.0            # host loss: from RAM ≥ 5× faster than from S3
RAM_VS_POSIX = 2.0         # ... and ≥ 2× faster than from the POSIX root read cold
REBUILD_VS_TCP = {"replica": 0.8, "parity": 0.5}  # rebuild rate / the hosts' TCP bandwidth
RESTART_VS_MEMCPY = 1.5    # trainer restart on a live host: restore() ≤ 1.5× a memcpy
LOOP_RATIO = 0.95          # steps/s with a memory checkpoint every step ≥ 95 % of none
# A worker's floor (docs/memory-tier.md, "What it costs in RAM"), in states: keep + 1
# checkpoints at the peak, each its own share and its redundancy (a copy: 1; parity
# p of a group of 4: p / (4 - p)), plus the trainer's state it maps.
FLOOR = {"replica": 3 * 2 + 1, "parity": 3 * (1 + 1 / 3) + 1, "parity2": 3 * 2 + 1,
         "replica_keep1": 2 * 2 + 1}
FLOOR_SLACK = 0.1          # peak ≤ the floor + 0.1× the state
FROZEN_VS_FLOOR = 0.5      # with 5 % of the state changing per step: ≤ 0.5× replica's floor


def _med(xs):
    return statistics.median(xs) if xs else None


def _spread(xs, fmt="%.1f"):
    if not xs:
        return "—"
    return (fmt + " (" + fmt + "–" + fmt + ")") % (_med(xs), min(xs), max(xs))


def _range(xs, fmt="%.1f"):
    return "—" if not xs else (fmt + "–" + fmt) % (min(xs), max(xs))


def _verdict(ok):
    return "—" if ok is None else ("met" if ok else "**not met**")


def host_memory(r):
    """A worker's share of its host's memory: its peak RSS, plus its /dev/shm mapping of
    the trainer's tensors where that is not already in its RSS."""
    return r["vmhwm_kb"] * 1024 + max(0, r.get("shm_bytes", 0) - r["rss_shmem_kb"] * 1024)


def markdown(rows):
    """The RESULTS.md section of memory_tier.jsonl's rows."""
    if not rows:
        return []
    runs = sorted({r["run"] for r in rows})
    mib = rows[0]["mib"]
    quick = any(r.get("quick") for r in rows)
    by = lambda bench, **kw: [r for r in rows if r["bench"] == bench and all(  # noqa: E731
        r.get(k) == v for k, v in kw.items())]
    L = ["", "## The memory tier (bench/memory_tier.py)", "",
         "Hosts are network namespaces on this machine (`tests/multihost/hosts.py`): tesserad on "
         "host 0, one worker on each of hosts 1–4 (`--copy-threads 1`), one trainer process per "
         "worker (`bench/memory_tier_trainer.py`: `tessera.CheckpointManager`, %g MiB of "
         "`attach()`ed float32 state per trainer in 4 tensors sharded over `{data: 4}`). "
         "Every figure and its comparison come from the same run; %d run(s)%s, rows in "
         "`bench/out/memory_tier.jsonl`. Medians, with the spread (min–max) over every "
         "sample of every run. The page cache is dropped before each kill, so the POSIX root "
         "(a directory on this VM's disk) is read cold; the S3 root is a Ceph RGW with a "
         "memory-backed OSD (`tools/s3/rgw.sh`) on the hosts' bridge." % (mib, len(runs), " (--quick)" if quick else "")]
    # Runs that measured different modes (a mode added later) say which.
    modes = {}
    for run in runs:
        ms = tuple(sorted({r["mode"] for r in rows if r["run"] == run and r.get("mode")}))
        modes.setdefault(ms, []).append(run)
    if len(modes) > 1:
        L[-1] += " Modes by run: %s." % "; ".join(
            "%s: %s" % (", ".join(map(str, rs)), ", ".join(ms)) for ms, rs in modes.items())
    meta = by("meta")
    if meta:
        L[-1] += " Runs: %s, on %d CPUs, the product code at `%s`." % (
            ", ".join(m["started_utc"] + (" (load %.1f)" % m["loadavg"] if m.get("loadavg") is not None else "") for m in meta),
            meta[0]["cpus"], "`, `".join(sorted({str(m["product_commit"]) for m in meta})))
    L.append("")
    T = ["| measure | ours | comparison (same run) | ratio (times: comparison / ours) | "
         "spread of ours | goal | verdict |",
         "|---|---:|---:|---:|---|---|---|"]
    notes = []

    # 1. stall
    # The memcpy of every mode pooled: four copies at once on this machine's cores move
    # by 2x from one mode's ten to the next's.
    mc = [x for r in by("memcpy") for x in r["together_ms"]]
    for mode in ("replica", "parity", "parity2", "replica_keep1", "replica_frozen"):
        st = by("stall", mode=mode)
        if not st or not mc:
            continue
        save = [r["save_ms"] for r in st]
        snap = [r["snapshot_ms"] for r in st]
        commit = [r["commit_ms"] for r in st]
        ok = all(r["committed"] for r in st)
        ratio = _med(save) / _med(mc)
        T.append("| stall: memory save() (%s), ms | %.1f | memcpy %.1f | %.2f× | %s | ≤ %.1f× "
                 "| %s |" % (mode, _med(save), _med(mc), ratio, _range(save), STALL_VS_MEMCPY,
                             _verdict(ratio <= STALL_VS_MEMCPY)))
        T.append("| worker's snapshot_ms (%s) | %.1f | memcpy %.1f | %.2f× | %s | | |" % (
            mode, _med(snap), _med(mc), _med(snap) / _med(mc), _range(snap)))
        # The first checkpoints of a mesh fill fresh buffers (page faults); later ones reuse.
        first = {}
        for r in st:
            first[r["run"]] = min(first.get(r["run"], r["step"]), r["step"])
        steady = [r["save_ms"] for r in st if r["step"] >= first[r["run"]] + 2]
        early = [r["save_ms"] for r in st if r["step"] < first[r["run"]] + 2]
        if steady and early:
            T.append("| ... stall from the 4th checkpoint of the mesh on (the 2nd and 3rd: %s "
                     "ms) | %.1f | memcpy %.1f | %.2f× | %s | (≤ %.1f×) | %s |" % (
                         _spread(early, "%.0f"), _med(steady), _med(mc),
                         _med(steady) / _med(mc), _range(steady), STALL_VS_MEMCPY,
                         _verdict(_med(steady) / _med(mc) <= STALL_VS_MEMCPY)))
        T.append("| save() → commit (%s), ms; %d of %d committed | %.1f | | | %s | every "
                 "checkpoint commits | %s |" % (mode, sum(r["committed"] for r in st), len(st),
                                                 _med(commit), _range(commit), _verdict(ok)))
    disk = by("stall", mode="disk")
    if disk:
        T.append("| disk save() for reference: stall; save() → commit, ms | %.1f; %.1f | | | "
                 "%s; %s | | |" % (_med([r["save_ms"] for r in disk]),
                                   _med([r["commit_ms"] for r in disk]),
                                   _range([r["save_ms"] for r in disk]),
                                   _range([r["commit_ms"] for r in disk])))

    # 2. host loss
    loss = {m: by("host_loss", mode=m) for m in ("replica", "parity", "parity2", "disk", "s3")}
    tot = {m: [r["total_s"] for r in v] for m, v in loss.items()}
    for m in ("replica", "parity", "parity2"):
        if not tot[m]:
            continue
        for other, goal, label in (("s3", RAM_VS_S3, "S3"), ("disk", RAM_VS_POSIX, "POSIX root")):
            if not tot[other]:
                continue
            r = _med(tot[other]) / _med(tot[m])
            T.append("| host loss → every trainer restored, from RAM (%s) vs from %s, s | %.2f "
                     "| %.2f | %.2f× | %s | ≥ %g× | %s |" % (
                         m, label, _med(tot[m]), _med(tot[other]), r, _range(tot[m], "%.2f"),
                         goal, _verdict(r >= goal)))
    for m in ("replica", "parity", "parity2"):
        rs = [r["restore_s"] for r in loss[m]]
        for other, goal, label in (("s3", RAM_VS_S3, "S3"), ("disk", RAM_VS_POSIX, "POSIX root")):
            ors = [r["restore_s"] for r in loss[other]]
            if rs and ors:
                r = _med(ors) / _med(rs)
                T.append("| host loss, the restore() calls alone, RAM (%s) vs %s, s | %.2f | "
                         "%.2f | %.2f× | %s | (≥ %g×) | %s |" % (
                             m, label, _med(rs), _med(ors), r, _range(rs, "%.2f"), goal,
                             _verdict(r >= goal)))
    # rebuild rates against iperf3
    ip = [r["bits_per_second"] / 8 for r in by("iperf3")]
    for m, goal in REBUILD_VS_TCP.items():
        lost = loss[m]
        local = [x for r in by("restart", mode=m) for x in r["restore_ms"]]
        if not ip or not lost:
            continue
        whole = [r["share_bytes"] / (r["restore_ms"][r["lost_rank"]] / 1000) for r in lost]
        rebuild = []
        if local:
            for r in lost:
                dt = (r["restore_ms"][r["lost_rank"]] - _med(local)) / 1000
                if dt > 0:
                    rebuild.append(r["share_bytes"] / dt)
        rate = rebuild or whole
        ratio = _med(rate) / _med(ip)
        T.append("| %s rebuild rate, MB/s (share bytes / (the replacement's restore() − "
                 "a local restore())) vs iperf3 TCP between two hosts | %.0f | %.0f | %.2f× | "
                 "%s | ≥ %.1f× | %s |" % (m, _med(rate) / 1e6, _med(ip) / 1e6, ratio,
                                          _range([x / 1e6 for x in rate], "%.0f"),
                                          goal, _verdict(ratio >= goal)))
        T.append("| ... the same over the replacement's whole restore() call, MB/s | %.0f | %.0f "
                 "| %.2f× | %s | | |" % (_med(whole) / 1e6, _med(ip) / 1e6,
                                         _med(whole) / _med(ip),
                                         _range([x / 1e6 for x in whole], "%.0f")))
    # 3. restart on a live host: the slowest trainer's restore() against a memcpy
    rst = {m: by("restart", mode=m) for m in ("replica", "parity", "parity2", "disk")}
    for m in ("replica", "parity", "parity2"):
        if not rst[m] or not mc:
            continue
        slowest = [max(r["restore_ms"]) for r in rst[m]]
        ratio = _med(slowest) / _med(mc)
        T.append("| trainer restart on live hosts (%s): restore(), the slowest of 4, ms | %.1f | "
                 "memcpy %.1f | %.2f× | %s | ≤ %.1f× | %s |" % (
                     m, _med(slowest), _med(mc), ratio, _range(slowest), RESTART_VS_MEMCPY,
                     _verdict(ratio <= RESTART_VS_MEMCPY)))
        if rst["disk"]:
            a = [r["total_s"] for r in rst[m]]
            b = [r["total_s"] for r in rst["disk"]]
            T.append("| ... kill → every trainer restored, RAM vs POSIX root read cold, s | %.2f | "
                     "%.2f | %.2f× | %s | | |" % (_med(a), _med(b), _med(b) / _med(a), _range(a, "%.2f")))
    # 4. training loops: the (a step of 20 memcpys), and the example's
    for m in ("replica", "parity"):
        rows_m = by("loop", mode=m)
        # Each run's step is 20× that run's memcpy: ratios within a run, then their median.
        for kind, label in (("memory", "save() every step"),
                            ("background", "save(background=True) every step")):
            ratios, steps_ms = [], []
            for run in sorted({r["run"] for r in rows_m}):
                got = [r["steps_per_s"] for r in rows_m if r["run"] == run and r["checkpoint"] == kind]
                none = [r["steps_per_s"] for r in rows_m if r["run"] == run and r["checkpoint"] == "none"]
                if got and none:
                    ratios.append(_med(got) / _med(none))
                    steps_ms.append(rows_m[[r["run"] for r in rows_m].index(run)]["step_ms"])
            if not ratios:
                continue
            T.append("| training loop, a step of 20× the memcpy (%s ms by run), %s (%s), steps/s "
                     "vs no checkpoint in the same run | %.1f %% | | | %s | ≥ %.0f %% | %s |" % (
                         ", ".join("%.0f" % x for x in steps_ms), label, m, _med(ratios) * 100,
                         ", ".join("%.1f %%" % (x * 100) for x in ratios), LOOP_RATIO * 100,
                         _verdict(_med(ratios) >= LOOP_RATIO)))
    tr = by("training")
    if tr:
        mem = [r["steps_per_s"] for r in tr if r["checkpoint"] == "memory"]
        none = [r["steps_per_s"] for r in tr if r["checkpoint"] == "none"]
        if mem and none:
            T.append("| training loop of examples/python (a step of ~2 ms, its all_reduce through "
                     "the workers), steps/s, a memory checkpoint every step vs none | %.1f | %.1f | "
                     "%.1f %% | %s | | |" % (_med(mem), _med(none), _med(mem) / _med(none) * 100,
                                            _range(mem)))
    # 5. CPU per GiB checkpointed
    for m in ("replica", "parity", "parity2", "replica_keep1", "replica_frozen", "disk"):
        cpu = by("cpu", mode=m)
        if not cpu:
            continue
        gib = [r["checkpoints"] * r["state_bytes"] / (1 << 30) for r in cpu]
        tcpu = [r["trainer_cpu_s"] * 1000 / g for r, g in zip(cpu, gib)]
        wcpu = [r["worker_cpu_s"] * 1000 / g for r, g in zip(cpu, gib)]
        T.append("| CPU per GiB checkpointed (%s), ms: trainers; workers (snapshot, redundancy, "
                 "commit) | %.0f; %.0f | | | %s; %s | (reported) | |" % (
                     m, _med(tcpu), _med(wcpu), _range(tcpu, "%.0f"), _range(wcpu, "%.0f")))
    # 6. memory per worker
    for m in ("replica", "parity", "parity2", "replica_keep1", "disk"):
        mem = by("worker_memory", mode=m)
        if not mem:
            continue
        x = [host_memory(r) / r["state_bytes"] for r in mem]
        hwm = [r["vmhwm_kb"] * 1024 / r["state_bytes"] for r in mem]
        floor = FLOOR.get(m)
        goal = floor + FLOOR_SLACK if floor else None
        T.append("| host memory per worker / state (%s): VmHWM + its /dev/shm mapping "
                 "(VmHWM alone) | %.2f× (%.2f×) | %s | | %s | %s | %s |" % (
                     m, _med(x), _med(hwm),
                     "floor %.2f×" % floor if floor else "state %g MiB" % mib, _range(x, "%.2f"),
                     "≤ %.2f×" % goal if goal else "(reference)",
                     _verdict(_med(x) <= goal) if goal else ""))
    frozen = by("worker_memory", mode="replica_frozen")
    if frozen:
        x = [host_memory(r) / r["state_bytes"] for r in frozen]
        hwm = [r["vmhwm_kb"] * 1024 / r["state_bytes"] for r in frozen]
        goal = FROZEN_VS_FLOOR * FLOOR["replica"]
        T.append("| host memory per worker / state with 5 %% of the state changing per step "
                 "(replica, keep 2; a frozen base of 19 of 20 tensors, shared with the checkpoint "
                 "before): VmHWM + its /dev/shm mapping (VmHWM alone) | %.2f× (%.2f×) | floor %.2f× "
                 "| %.2f of the floor | %s | ≤ %.2f× | %s |" % (
                     _med(x), _med(hwm), FLOOR["replica"], _med(x) / FLOOR["replica"],
                     _range(x, "%.2f"), goal, _verdict(_med(x) <= goal)))
    else:
        T.append("| host memory with 5 % of the state changing per step | not measured | | | | "
                 "≤ 0.5× the floor | — |")
    # 7. tesserad
    for r in sorted(by("control"), key=lambda r: r["workers"]):
        if r.get("failed"):
            T.append("| tesserad per memory checkpoint, %d workers | failed | | | | | %s |" % (
                r["workers"], r["error"].splitlines()[-1][:200] if r["error"] else "?"))
    cp = [r for r in by("control") if not r.get("failed")]
    for n in sorted({r["workers"] for r in cp}):
        rs = [r for r in cp if r["workers"] == n]
        req = [r["requests_per_checkpoint"] for r in rs]
        put = [sum(v for k, v in r["by_route"].items() if k.startswith("PUT /api/v1/meshes/"))
               for r in rs]
        idle = [r["idle_requests_per_checkpoint_time"] for r in rs]
        beats = [r["heartbeats_per_checkpoint"] for r in rs if "heartbeats_per_checkpoint" in r]
        ibeats = [r["idle_heartbeats_per_checkpoint_time"] for r in rs
                  if "heartbeats_per_checkpoint" in r]
        cpu = [r["cpu_ms_per_checkpoint"] for r in rs]
        net = [r["net_cpu_ms_per_checkpoint"] for r in rs]
        lat = [r["per_checkpoint_ms"] for r in rs]
        T.append("| tesserad per memory checkpoint, %d workers: requests (the report PUT; "
                 "all but heartbeats, and the same at idle over as long); CPU ms (less idle) "
                 "| %.2f (%.2f; %.2f idle); %.2f (%.2f) | | | %s | | |" % (
                     n, _med(put), _med(req), _med(idle), _med(cpu), _med(net),
                     "a checkpoint every %.0f ms" % _med(lat)))
        if beats:
            T.append("| ... heartbeats to tesserad per memory checkpoint, %d workers (at idle "
                     "over as long) | %.2f (%.2f) | | | %s | | |" % (
                         n, _med(beats), _med(ibeats), _range(beats, "%.2f")))
    # Detail tables.
    D = []
    if any(by("host_loss")) or any(by("restart")):
        D += ["Recoveries, each run's (kill → every trainer restored; the parts: worker up, "
              "trainer up (process start + attach), the restore() calls; restore() per rank in "
              "ms; tier/source per rank; bytes equal to the saved state):", "",
              "| case | total s | worker up s | trainer(s) up s | restore() s | restore() ms by "
              "rank | tier / source | bytes equal |", "|---|---:|---:|---:|---:|---|---|---|"]
        for r in by("host_loss"):
            D.append("| host loss, %s (rank %d lost) | %.2f | %.2f | %.2f | %.2f | %s | %s | %s |"
                     % (r["mode"], r["lost_rank"], r["total_s"], r["worker_up_s"],
                        r["trainer_up_s"], r["restore_s"],
                        " / ".join("%.0f" % x for x in r["restore_ms"]),
                        ", ".join("%s/%s" % ts for ts in zip(r["tier"], r["source"])),
                        "yes" if r["equal"] else "**no**"))
        for r in by("restart"):
            D.append("| restart, %s | %.2f | — | %.2f | %.2f | %s | %s | %s |" % (
                r["mode"], r["total_s"], r["trainers_up_s"], r["restore_s"],
                " / ".join("%.0f" % x for x in r["restore_ms"]),
                ", ".join("%s/%s" % ts for ts in zip(r["tier"], r["source"])),
                "yes" if r["equal"] else "**no**"))
        bad = [r for r in by("host_loss") + by("restart") if not r["equal"]]
        if bad:
            notes.append("- Some restores did not give back the saved bytes (rows above).")
        D.append("")
    mem = by("worker_memory")
    if mem:
        D += ["Worker memory after the stall's saves (/proc/<pid>/status, every host, "
              "multiples of the state):", "",
              "| mode | VmHWM | VmRSS | RssAnon | RssShmem | RssFile | host's /dev/shm |",
              "|---|---|---|---|---|---|---|"]
        for m in ("replica", "parity", "parity2", "replica_keep1", "disk"):
            rs = by("worker_memory", mode=m)
            if rs:
                f = lambda k: _spread([r[k] * 1024 / r["state_bytes"] for r in rs], "%.2f")  # noqa
                shm = _spread([r.get("shm_bytes", 0) / r["state_bytes"] for r in rs], "%.2f")
                D.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                    m, f("vmhwm_kb"), f("vmrss_kb"), f("rss_anon_kb"), f("rss_shmem_kb"),
                    f("rss_file_kb"), shm))
        D.append("")
    mc = by("memcpy")
    if mc:
        alone = [x for r in mc for x in r["alone_ms"]]
        together = [x for r in mc for x in r["together_ms"]]
        D.append("The memcpy: each trainer's `np.copyto` of its whole state into a private "
                 "buffer, warmed, all four trainers at once as they save: %s ms (pooled over "
                 "the modes of every run); rank 0 alone: %s ms. The stall is compared with the "
                 "first, the conditions of the saves (4 trainers and 4 workers on this "
                 "machine's cores)."
                 % (_spread(together), _spread(alone)))
        D.append("")
    cp = by("control")
    if cp:
        D.append("tesserad per memory checkpoint, by route (requests per checkpoint, heartbeats "
                 "left out):")
        D.append("")
        for r in sorted(cp, key=lambda r: (r["workers"], r["run"])):
            if r.get("failed"):
                D.append("- %d workers (run %d): failed: %s" % (r["workers"], r["run"],
                                                               r["error"][-300:]))
                continue
            beats = ""
            if "heartbeats_per_checkpoint" in r:
                beats = "; heartbeats %.2f per checkpoint (%.2f at idle)" % (
                    r["heartbeats_per_checkpoint"], r["idle_heartbeats_per_checkpoint_time"])
            D.append("- %d workers (run %d): %s%s; tesserad CPU %.2f ms per checkpoint, %.2f at "
                     "idle over the same time, a checkpoint every %.0f ms" % (
                         r["workers"], r["run"], ", ".join(
                             "%s %.2f" % kv for kv in sorted(r["by_route"].items())) or "none",
                         beats, r["cpu_ms_per_checkpoint"], r["idle_cpu_ms_per_checkpoint_time"],
                         r["per_checkpoint_ms"]))
        D.append("")
    L += T
    L.append("")
    for r in by("tesserad_view"):
        if r.get("error") or not r.get("memory_steps"):
            notes.append("- tesserad lists no memory checkpoint of the %s mesh after its saves "
                         "(%s; workers' `memory_bytes` %s): rank 0's report (`PUT "
                         "/api/v1/meshes/{m}/memory-checkpoints`) is not taken, so the "
                         "request counted for tesserad per checkpoint is that refused report." % (
                             r["mode"], r.get("error") or "%d checkpoints listed" % r["listed"],
                             r.get("memory_bytes")))
            break
    cps = [r for r in by("control") if "heartbeats_per_checkpoint" in r and not r.get("failed")]
    extra = [(r["workers"], (r["heartbeats_per_checkpoint"]
                             - r["idle_heartbeats_per_checkpoint_time"]) / r["workers"])
             for r in cps]
    if extra and max(x for _, x in extra) > 0.5:
        notes.append("- Heartbeats: during memory checkpoints each worker sends up to %.1f "
                     "heartbeats per checkpoint beyond its interval (%s extra per worker and "
                     "checkpoint). The heartbeat thread waits on the agent's shared condition "
                     "variable (`worker/agent.cc`, `HeartbeatLoop`), which the save paths notify, "
                     "and beats whenever it wakes. tesserad's CPU per checkpoint above includes "
                     "them; its request count leaves them out." % (
                         max(x for _, x in extra),
                         ", ".join("%d workers %.2f" % e for e in sorted(set(extra)))))
    tr = by("training")
    if tr:
        mem = [r["steps_per_s"] for r in tr if r["checkpoint"] == "memory"]
        none = [r["steps_per_s"] for r in tr if r["checkpoint"] == "none"]
        if mem and none:
            notes.append("- Training loop: the example's model holds %d bytes of state "
                         "(parameters and Adam's moments); a step without checkpoints takes "
                         "%.2f ms (its all_reduce through the workers included), and a memory "
                         "checkpoint after each step adds %.2f ms to it (rounds of %d steps, "
                         "alternating, every rank)." % (
                             tr[0]["state_bytes"], 1000 / _med(none),
                             1000 / _med(mem) - 1000 / _med(none), tr[0]["steps"]))
    if by("worker_memory"):
        notes.append("- Memory: a worker keeps `keep` committed memory checkpoints (2 by "
                     "default; `replica_keep1` is keep=1), each its own share plus what it "
                     "holds for its peers (a copy: 1×; parity of 4: 1/3×; parity2, of 4 "
                     "surviving 2 losses: 1×), and the one being "
                     "taken; the trainer's tensors are the host's /dev/shm mapping, which the "
                     "worker maps too (its RssShmem), counted once in the host's figure. The "
                     "floor is docs/memory-tier.md's (\"What it costs in RAM\"); beyond it, the "
                     "worker process itself (its code, threads and heap) and, in parity modes, "
                     "the exchange's landing buffers (2 MiB, two per member of the group).")
    loops = by("loop")
    if loops:
        notes.append("- Training loops of the issue: every trainer runs steps of 20× the state's "
                     "memcpy (all four at once, measured before) of device time, a sleep: the "
                     "host's CPUs are free, as while an accelerator computes; then the "
                     "optimizer's write into every page of the state, then the save. "
                     "`background=True`: the save returns at once and the next step's device "
                     "time covers the snapshot; the write waits for it. Rounds of %d steps, "
                     "alternating none, memory, memory in the background; each round's figure "
                     "is its slowest trainer's. A checkpoint every step cannot be faster than "
                     "the exchange: on this VM the four hosts' replication (4 × 256 MiB per "
                     "checkpoint through one kernel on 2 vCPUs) takes about as long as a step, "
                     "and back-pressure then slows the loop to its pace." % loops[0]["steps"])
    L += notes
    if notes:
        L.append("")
    return L + D
