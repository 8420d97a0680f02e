#!/usr/bin/env bash
# tools/s3/rgw.sh's launch returns once the daemon it started is running (or has
# ended), so a check of `alive` right after it never mistakes the child, still a copy
# of the script before its exec, for a daemon that exited during startup. Needs
# neither root nor Ceph: the "daemons" are shells that wait.
set -euo pipefail
source "$(dirname "$0")/../../tools/s3/rgw.sh"
work=$(mktemp -d)
set_paths "$work"
mkdir -p "$RUN" "$LOGS"
: >"$CONF"
# Each daemon leads its own session and process group (setsid): end the groups.
cleanup() { local f; for f in "$RUN"/*.pid; do kill -TERM -- "-$(cat "$f")" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

# Descriptors for the child to close before its exec (as a caller's may be): they
# widen the window in which it is still a copy of this shell.
for i in $(seq 400); do exec {fd}</dev/null; done

for i in $(seq 40); do
  # `; :` keeps bash from exec'ing sleep, so the process keeps its -c CONF arguments.
  launch "d$i" bash -c 'sleep 60; :'
  alive "d$i" || { echo "FAIL: daemon d$i not alive right after launch (pid $(pid_of "d$i"))"; exit 1; }
done
echo "ok: 40 launches, each alive when launch returned"

# A command that cannot run: launch returns, and the daemon is not alive.
launch bad /nonexistent/daemon
if alive bad; then echo "FAIL: a daemon that could not exec counts as alive"; exit 1; fi
grep -q "failed to execute /nonexistent/daemon" "$LOGS/bad.out" ||
  { echo "FAIL: bad.out does not say why: $(cat "$LOGS/bad.out")"; exit 1; }
echo "ok: a daemon that cannot exec is reported dead, its output says why"
