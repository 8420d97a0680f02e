"""What the sections of bench/RESULTS.md share: reading a benchmark's JSON lines, running
a shell command for a machine fact, and formatting figures, ratios and verdicts.
Standard library only (bench/report.py runs it with Debian's /usr/bin/python3)."""
import json
import os
import statistics
import subprocess

HEADLINE_THREADS = 2  # both cores of this machine; 1-thread figures are in the detail tables


def load(path):
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - machine facts are best effort
        return ""


def med(xs):
    return statistics.median(xs) if xs else None


def gb(x, digits=3):
    return "—" if x is None else f"{x:.{digits}f}"


def runs_text(xs, digits=3):
    return " / ".join(f"{x:.{digits}f}" for x in xs) if xs else "—"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def ratio_text(r):
    return "—" if r is None else f"{r:.2f}×"


def verdict(r, need):
    if r is None:
        return "not measured"
    return "**met**" if r >= need else "**not met**"


def verdict_below(r, limit, strict=False):
    """Met when r ≤ limit (r < limit when strict)."""
    if r is None:
        return "not measured"
    return "**met**" if (r < limit if strict else r <= limit) else "**not met**"


def size_text(n):
    if n >= 1 << 20:
        return f"{n >> 20} MiB"
    if n >= 1 << 10:
        return f"{n >> 10} KiB"
    return f"{n} B"


def us_text(x):
    if x is None:
        return "—"
    return f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def us_runs(xs):
    return " / ".join(us_text(x) for x in xs) if xs else "—"


def bw_text(x):
    if x is None:
        return "—"
    return f"{x:.4f}" if x < 0.01 else f"{x:.3f}"
