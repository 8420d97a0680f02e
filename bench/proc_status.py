"""What /proc says of a process, for the benchmarks' memory figures."""

import os


def status_kb(pid, field):
    """A kB field of /proc/<pid>/status (VmHWM, VmRSS, ...); 0 when gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak(pid):
    """Sets VmHWM of `pid` back to its VmRSS (Linux's clear_refs "5"), so that a peak
    measured later is one of what came after, not of the set-up before it."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
    except OSError:
        pass


def descendants(pid):
    """Every process below `pid`, from /proc/<pid>/task/*/children."""
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                for child in f.read().split():
                    out.append(int(child))
                    out.extend(descendants(int(child)))
    except OSError:
        pass
    return out
