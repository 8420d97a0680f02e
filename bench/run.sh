#!/bin/bash
# The storage benchmark, side by side with its peers, in one command:
#
#   bash bench/run.sh
#
# 1. builds tessera_bench_storage (Release) in build-bench/;
# 2. on one disk (a temp dir under bench/out/), alternates peer / ours / peer:
#      shared/peers/disk_fio.sh      fio write/read, memcpy, loopback (pass 1)
#      shared/peers/save_torch.py    torch.save/torch.load and DCP of the same 1 GiB state
#      tessera_bench_storage         our save/read/index merge
#      tessera_bench_cluster         tesserad + 4 workers: stall, save, restore, reshard,
#                                    500-worker heartbeats, a save across 64 ranks
#      shared/peers/disk_fio.sh      again (pass 2), so the disk's drift is visible
#    every JSON line goes to bench/out/*.jsonl;
# 3. bench/report.py turns them into bench/RESULTS.md.
#
# It installs nothing. About 4–5 minutes on the 2-vCPU VM (most of it the peers).
# Knobs for quick trials (the report says when they differ from the defaults):
#   TESSERA_BENCH_SCALE (1.0), TESSERA_BENCH_REPEAT (2).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
peers=$(cd "$repo/.." && pwd)/shared/peers
py=/usr/bin/python3
scale=${TESSERA_BENCH_SCALE:-1.0}
repeat=${TESSERA_BENCH_REPEAT:-2}

die() { echo "bench/run.sh: $*" >&2; exit 1; }

# --- prerequisites: say what is missing and how to get it, install nothing ---
for f in disk_fio.sh save_torch.py; do
  [ -f "$peers/$f" ] ||
    die "peer script $peers/$f is missing (the peers live in ../shared/peers next to $repo)"
done
missing=()
for tool in cmake ninja g++ fio; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ -x "$py" ] || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  die "missing: ${missing[*]}. On Debian 12: apt-get install -y cmake ninja-build" \
      "build-essential fio iperf3 python3-torch python3-numpy"
fi
"$py" -c 'import torch, numpy' 2>/dev/null ||
  die "$py cannot import torch and numpy." \
      "On Debian 12: apt-get install -y python3-torch python3-numpy"
# disk_fio.sh ends with loopback TCP figures (iperf3) that this comparison does not
# use; without iperf3 that part fails after the fio and memcpy lines are out.
if ! command -v iperf3 >/dev/null 2>&1; then
  echo "bench/run.sh: iperf3 is missing, so disk_fio.sh will stop after its fio and memcpy" \
       "lines (the ones used here); apt-get install -y iperf3 for its loopback figures" >&2
fi

cd "$repo"
out=bench/out
mkdir -p "$out"
# Results of an earlier run would mix into the report.
rm -f "$out"/*.jsonl
steps="$out/steps.jsonl"

# step NAME OUTFILE CMD...: runs CMD with stdout into OUTFILE, records its wall time.
step() {
  local name=$1 file=$2; shift 2
  echo "== $name" >&2
  local t0 t1 rc=0 load0 load1
  # Load averages around the step: other processes on 2 vCPUs move every figure.
  load0=$(cut -d' ' -f1 /proc/loadavg)
  t0=$(date +%s.%N)
  # Status kept by hand: set -e does not apply inside a function called from `||`.
  "$@" > "$file" || rc=$?
  t1=$(date +%s.%N)
  load1=$(cut -d' ' -f1 /proc/loadavg)
  awk -v n="$name" -v s="$(date -u -d "@$t0" +%Y-%m-%dT%H:%M:%SZ)" -v t0="$t0" -v t1="$t1" \
    -v f="$(basename "$file")" -v rc="$rc" -v l0="$load0" -v l1="$load1" \
    'BEGIN { printf "{\"step\": \"%s\", \"start_utc\": \"%s\", \"wall_s\": %.2f, " \
      "\"output\": \"%s\", \"status\": %d, \"loadavg_before\": %s, " \
      "\"loadavg_after\": %s}\n", n, s, t1 - t0, f, rc, l0, l1 }' >> "$steps"
  [ "$rc" -eq 0 ] || echo "bench/run.sh: step $name failed with status $rc" >&2
  return "$rc"
}

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
step build "$out/build.log" bash -c \
  'cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release &&
   cmake --build build-bench -j2 --target tessera_bench_storage tessera_bench_cluster tesserad tessera-worker' ||
  { tail -n 40 "$out/build.log" >&2; die "build failed (full log: $out/build.log)"; }
bench_bin=build-bench/bin/tessera_bench_storage
[ -x "$bench_bin" ] || die "build did not produce $bench_bin (see $out/build.log)"

# fio_step NAME: disk_fio.sh into $out/NAME.jsonl. A failure after all six fio lines
# (the loopback part, e.g. without iperf3) is tolerated; anything less is fatal.
fio_step() {
  local file="$out/$1.jsonl" rc=0
  step "$1" "$file" env DIR="$tmp" bash "$peers/disk_fio.sh" || rc=$?
  [ "$rc" -eq 0 ] && return 0
  local n
  n=$(grep -c '"bench": "fio"' "$file" || true)
  [ "$n" -ge 6 ] || die "disk_fio.sh failed (status $rc) before its fio results were out"
  echo "bench/run.sh: continuing with the $n fio lines of $1" >&2
}

# One temp dir on the disk the project writes to; every run writes below it.
tmp=$(mktemp -d "$out/tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fio_step fio_pass1
step torch "$out/torch.jsonl" "$py" "$peers/save_torch.py" --dir "$tmp"
step tessera "$out/tessera.jsonl" "$bench_bin" --dir "$tmp" --json --scale "$scale" \
  --repeat "$repeat"
# The cluster: tesserad + 4 workers checkpointing ~1 GiB held in shared-memory mappings.
step cluster "$out/cluster.jsonl" build-bench/bin/tessera_bench_cluster --dir "$tmp" \
  --scale "$scale" --repeat 3
fio_step fio_pass2
finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)

"$py" bench/report.py --out "$out" --results bench/RESULTS.md --started "$started" \
  --finished "$finished" --command "bash bench/run.sh" --scale "$scale" --repeat "$repeat"
echo "wrote bench/RESULTS.md" >&2
