#!/bin/bash
# The storage and collectives benchmarks, side by side with their peers, in one command:
#
#   bash bench/run.sh
#
# 0. installs the Debian 12 packages that it, the build and the peers need when any is
#    missing (apt-get, with sudo when not root, as tools/setup.sh does): the C++ build
#    dependencies of tools/setup.sh, fio, iperf3, Open MPI (openmpi-bin, libopenmpi-dev),
#    python3-torch, python3-numpy, python3-boto3 and Ceph (ceph-mon, ceph-osd, radosgw,
#    ceph-common) for the S3 comparison;
# 1. builds every program a later step runs (Release, in build-bench/): tesserad, and
#    for storage tessera_bench_storage, tessera_bench_cluster, tessera-worker and the
#    tessera CLI (bench/export.py), for collectives tessera_bench_collectives and
#    tessera_bench_rest_barrier;
# 2. storage: on one disk (a temp dir under bench/out/), alternates peer / ours / peer:
#      bench/peers/disk_fio.sh      fio write/read, memcpy, loopback (pass 1)
#      bench/peers/save_torch.py    torch.save/torch.load and DCP of the same 1 GiB state
#      tessera_bench_storage        our save/read/index merge
#      tessera_bench_cluster        tesserad + 4 workers: stall, save, restore, reshard,
#                                   500-worker heartbeats, a save across 64 ranks
#      bench/export.py              safetensors export (REST job, `tessera export`)
#      bench/worker_loss.py         a worker frozen mid-save: time until the save fails
#      bench/float_codec.py         the float codec against python3-blosc and zstd-1
#      bench/peers/disk_fio.sh      again (pass 2), so the disk's drift is visible
#      S3: a Ceph RGW from tools/s3/rgw.sh; bench/s3_boto3.py (boto3 upload_file and
#      download_file of 1 GiB), tessera_bench_cluster with an s3:// root, boto3 again
#      bench/incremental.py         incremental saves against full ones: 1 GiB on one worker,
#                                   10 saves, 5 % or all of the bytes changed per step, the
#                                   two interleaved save by save, 2 runs (about 4 minutes)
#      bench/dcp.py                 PyTorch DCP through tessera.dcp against DCP's FileSystemWriter,
#                                   FileSystemReader and stagers: 4 ranks × 256 MiB, 2 runs
#                                   (about 15 minutes; torch from .venv/, tools/venv.sh)
#      bench/jax_orbax.py           JAX through tessera.jax against Orbax's CheckpointManager:
#                                   4 processes × 2 CPU devices, 1 GiB, and a restore onto 2
#                                   processes, 2 runs (about 3 minutes; jax from .venv/)
#      bench/memory_tier.py         the memory tier, 4 namespace hosts (needs root) × 256 MiB
#                                   per trainer: the stall of a memory save against a memcpy,
#                                   a host's loss restored from RAM against the POSIX root and
#                                   S3 (its own Ceph RGW), iperf3 between the hosts, a trainer
#                                   restart, the example's loop, tesserad's cost at 4/32/256
#                                   workers, the workers' memory (about 15 minutes)
# 3. collectives: 4 ranks on loopback TCP, TESSERA_BENCH_ROUNDS rounds of
#      bench/peers/allreduce_torch_gloo.py   torch.distributed Gloo
#      tessera_bench_collectives             ours (4 processes, TcpTransport)
#      bench/peers/allreduce_mpi.sh          Open MPI, TCP BTL (and vader, as context)
#      tessera_bench_collectives             ours again
#    so drift shows in the runs; then ours with ranks as threads (InProcessTransport,
#    the engine without the network) and tesserad's REST barrier with 4 clients
#    (tessera_bench_rest_barrier; "not measured" when tesserad lacks the route);
#    every JSON line goes to bench/out/*.jsonl;
# 4. history: tesserad and one worker through 100,000 tiny saves while two clients
#    list jobs (bench/job_history.py): save latency of the first and last 1,000,
#    tesserad's RSS and catalog size, workers ever suspected;
# 5. bench/report.py turns them into bench/RESULTS.md.
#
# The peers and what they measure: bench/peers/README.md. Where nothing can be
# installed (not root and no sudo, or no apt-get), it names what is missing and stops;
# only Open MPI is then optional: its steps are skipped and the report marks them
# "not measured (openmpi missing)". About 9 minutes on the 2-vCPU VM (most of it the
# peers), plus the first install.
# On a machine shared with other builds, hold the build lock for the whole run so
# that no compiler shares the cores with a measurement:
#   flock /tmp/tessera-build.lock bash bench/run.sh
# Knobs for quick trials (the report says when they differ from the defaults):
#   TESSERA_BENCH_ONLY (all): "collectives" runs only part 3, "storage" only part 2,
#     "s3" only the S3 comparison of part 2;
#     either writes bench/out/RESULTS.<part>.md and leaves bench/RESULTS.md alone;
#     "setup" only installs what a full run needs (part 0), then exits: no build, no
#     measurement;
#   TESSERA_BENCH_SCALE (1.0), TESSERA_BENCH_REPEAT (2): the storage state and its runs;
#   TESSERA_BENCH_ROUNDS (2): collectives rounds (gloo, ours, mpi, ours each);
#   TESSERA_BENCH_HISTORY_SAVES (100000): saves of part 5 ("history": tesserad over a
#     long run, bench/job_history.py, about 25 minutes at 100,000).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
peers=$here/peers
py=/usr/bin/python3
scale=${TESSERA_BENCH_SCALE:-1.0}
repeat=${TESSERA_BENCH_REPEAT:-2}
only=${TESSERA_BENCH_ONLY:-all}
rounds=${TESSERA_BENCH_ROUNDS:-2}
history_saves=${TESSERA_BENCH_HISTORY_SAVES:-100000}

die() { echo "bench/run.sh: $*" >&2; exit 1; }

case "$only" in
  all | storage | collectives | s3 | history | setup) ;;
  *) die "TESSERA_BENCH_ONLY must be all, storage, collectives, s3, history or setup (got '$only')" ;;
esac
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "TESSERA_BENCH_ROUNDS must be a positive integer"
# setup installs for every part.
want() { [ "$only" = all ] || [ "$only" = setup ] || [ "$only" = "$1" ]; }

# --- prerequisites: Debian packages, installed when missing (as tools/setup.sh does) ---
packages=(
  # The build: the C++ dependencies of tools/setup.sh (which also builds build/, so it
  # is not called here); keep in step with its list.
  build-essential cmake ninja-build pkg-config libcpp-httplib-dev nlohmann-json3-dev
  libsqlite3-dev libzstd-dev libxxhash-dev libisal-dev libcli11-dev libgtest-dev libgmock-dev
  libssl-dev libcurl4-openssl-dev
  # bench/report.py, bench/job_history.py and the Python peers use Debian's python3.
  python3 python3-venv
)
# disk_fio.sh (fio, numpy's memcpy, iperf3 on loopback) and save_torch.py.
# python3-blosc: the peer of the float codec (bench/float_codec.py).
want storage && packages+=(fio iperf3 python3-numpy python3-torch python3-blosc)
# The S3 comparison: a Ceph RGW (tools/s3/rgw.sh) and bench/s3_boto3.py.
{ want storage || [ "$only" = s3 ]; } &&
  packages+=(ceph-mon ceph-osd radosgw ceph-common python3-boto3 python3-numpy)
# allreduce_torch_gloo.py, bench/sparse_torch_gloo.py; allreduce_mpi.sh (mpicc, mpirun).
want collectives && packages+=(python3-torch python3-numpy openmpi-bin libopenmpi-dev)

# Missing packages, by dpkg-query; installing them needs apt-get, and root or sudo.
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | awk '!seen[$0]++')
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
else
  missing=("${packages[@]}")
fi
sudo="" why=""
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  why="no apt-get"
elif [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
  why="not root, no sudo"
elif [ "$(id -u)" -ne 0 ]; then
  sudo=sudo
fi
# The hint of the messages below, where installing is impossible.
install_hint=""
if [ ${#missing[@]} -gt 0 ] && [ -z "$why" ]; then
  echo "bench/run.sh: installing ${missing[*]}" >&2
  $sudo apt-get update -qq || die "apt-get update failed"
  # Through env: sudo drops DEBIAN_FRONTEND from the environment.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
elif [ ${#missing[@]} -gt 0 ]; then
  install_hint=" Cannot install ($why); as root: apt-get install -y ${missing[*]}"
fi

# What the steps call, checked whether just installed or not.
peer_files=()
want storage && peer_files+=(disk_fio.sh save_torch.py)
want collectives && peer_files+=(allreduce_torch_gloo.py allreduce_mpi.sh allreduce_mpi.c)
for f in "${peer_files[@]}"; do
  [ -f "$peers/$f" ] || die "peer script bench/peers/$f is missing"
done
missing=()
tools=(cmake ninja g++)
want storage && tools+=(fio)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ -x "$py" ] || missing+=(python3)
[ ${#missing[@]} -eq 0 ] || die "missing: ${missing[*]}.$install_hint"
if want storage || want collectives; then
  "$py" -c 'import torch, numpy' 2>/dev/null ||
    die "$py cannot import torch and numpy.$install_hint"
fi
# Open MPI is installed above; only where nothing can be installed does the
# collectives part run without it, the report marking its columns "not measured".
have_mpi=1
if want collectives && ! { command -v mpicc && command -v mpirun; } >/dev/null 2>&1; then
  [ -n "$why" ] || die "Open MPI was installed, yet mpicc or mpirun is not on PATH"
  have_mpi=0
  echo "bench/run.sh: Open MPI is missing (no mpicc/mpirun) and cannot be installed ($why)," \
       "so allreduce_mpi.sh is skipped and RESULTS.md marks its columns" \
       "\"not measured (openmpi missing)\". As root: apt-get install -y openmpi-bin libopenmpi-dev" >&2
fi
# disk_fio.sh ends with loopback TCP figures (iperf3) that this comparison does not
# use; without iperf3 that part fails after the fio and memcpy lines are out.
if want storage && ! command -v iperf3 >/dev/null 2>&1; then
  echo "bench/run.sh: iperf3 is missing${why:+ and cannot be installed ($why)}, so disk_fio.sh" \
       "will stop after its fio and memcpy lines (the ones used here); apt-get install -y iperf3" \
       "for its loopback figures" >&2
fi
if [ "$only" = setup ]; then
  echo "bench/run.sh: setup done; nothing built or measured" >&2
  exit 0
fi

cd "$repo"
out=bench/out
mkdir -p "$out"
# Results of an earlier run would mix into the report.
rm -f "$out"/*.jsonl
steps="$out/steps.jsonl"

# CPU time, in clock ticks: user + nice + system of the whole machine (/proc/stat), and
# of this shell's finished children (cutime + cstime of /proc/$$/stat). Around a step,
# the difference is what other processes (another build, tests) took from the 2 vCPUs.
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 }' /proc/stat; }
children_ticks() { awk '{ print $16 + $17 }' "/proc/$$/stat"; }
hz=$(getconf CLK_TCK)

# step NAME OUTFILE CMD...: runs CMD with stdout into OUTFILE, records its wall time.
step() {
  local name=$1 file=$2; shift 2
  echo "== $name" >&2
  local t0 t1 rc=0 load0 load1 m0 m1 c0 c1
  # Load averages around the step: other processes on 2 vCPUs move every figure.
  load0=$(cut -d' ' -f1 /proc/loadavg)
  m0=$(machine_ticks)
  c0=$(children_ticks)
  t0=$(date +%s.%N)
  # Status kept by hand: set -e does not apply inside a function called from `||`.
  "$@" > "$file" || rc=$?
  t1=$(date +%s.%N)
  c1=$(children_ticks)
  m1=$(machine_ticks)
  load1=$(cut -d' ' -f1 /proc/loadavg)
  awk -v n="$name" -v s="$(date -u -d "@$t0" +%Y-%m-%dT%H:%M:%SZ)" -v t0="$t0" -v t1="$t1" \
    -v f="$(basename "$file")" -v rc="$rc" -v l0="$load0" -v l1="$load1" \
    -v own="$((c1 - c0))" -v other="$(((m1 - m0) - (c1 - c0)))" -v hz="$hz" \
    'BEGIN { printf "{\"step\": \"%s\", \"start_utc\": \"%s\", \"wall_s\": %.2f, " \
      "\"output\": \"%s\", \"status\": %d, \"loadavg_before\": %s, " \
      "\"loadavg_after\": %s, \"cpu_s\": %.2f, \"other_cpu_s\": %.2f}\n", \
      n, s, t1 - t0, f, rc, l0, l1, own / hz, (other > 0 ? other : 0) / hz }' >> "$steps"
  [ "$rc" -eq 0 ] || echo "bench/run.sh: step $name failed with status $rc" >&2
  return "$rc"
}

# skip NAME REASON: records a step that did not run, and why.
skip() {
  echo "== $1 skipped: $2" >&2
  printf '{"step": "%s", "skipped": "%s"}\n' "$1" "$2" >> "$steps"
}

# Every program a step runs from build-bench/bin; each is checked to exist after the build.
targets=(tesserad)
want storage && targets+=(tessera_bench_storage tessera_bench_cluster tessera-worker tessera)
[ "$only" = s3 ] && targets+=(tessera_bench_cluster tessera-worker)
want collectives && targets+=(tessera_bench_collectives tessera_bench_rest_barrier)
want history && targets+=(tessera-worker)
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | awk '!seen[$0]++')
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
step build "$out/build.log" bash -c \
  'cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release &&
   cmake --build build-bench -j2 --target "$@"' build "${targets[@]}" ||
  { tail -n 40 "$out/build.log" >&2; die "build failed (full log: $out/build.log)"; }
for t in "${targets[@]}"; do
  [ -x "build-bench/bin/$t" ] || die "build did not produce build-bench/bin/$t (see $out/build.log)"
done
bench_bin=build-bench/bin/tessera_bench_storage

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
rgw_dir=""
cleanup() {
  [ -z "$rgw_dir" ] || bash tools/s3/rgw.sh stop "$rgw_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$rgw_dir"
}
trap cleanup EXIT

# The cluster on S3: a throwaway Ceph RGW (tools/s3/rgw.sh), boto3's upload_file /
# download_file of 1 GiB to it, ours (save and restore of the same state), boto3 again.
# Skipped, and said so in the report, when the gateway cannot start or boto3 is missing.
s3_part() {
  if ! "$py" -c 'import boto3' 2>/dev/null; then
    skip s3 "python3-boto3 missing (apt-get install -y python3-boto3)"
    return 0
  fi
  rgw_dir=$(mktemp -d /var/tmp/tessera-bench-rgw.XXXXXX)
  local env
  # Memory-backed OSD: room for two checkpoints and a boto3 object while deletes are collected.
  if ! env=$(TESSERA_RGW_STORE_BYTES=$((6 << 30)) bash tools/s3/rgw.sh start "$rgw_dir" 0 \
      2>"$out/rgw.log"); then
    skip s3 "tools/s3/rgw.sh could not start Ceph RGW (needs root or ceph installed; see bench/out/rgw.log)"
    return 0
  fi
  eval "$env"
  "$py" -c 'import boto3, os; boto3.client("s3", endpoint_url=os.environ["TESSERA_S3_ENDPOINT"],
    region_name=os.environ.get("AWS_REGION", "us-east-1")).create_bucket(Bucket="tessera-bench")'
  local boto=("$py" bench/s3_boto3.py --endpoint "$TESSERA_S3_ENDPOINT" --bucket tessera-bench
              --dir "$tmp" --repeat 2 --bytes "$(awk -v s="$scale" 'BEGIN { printf "%d", s * 1073741824 }')")
  step s3_boto3_1 "$out/s3_boto3_1.jsonl" "${boto[@]}" || true
  step s3_cluster "$out/s3_cluster.jsonl" build-bench/bin/tessera_bench_cluster --dir "$tmp" \
    --scale "$scale" --repeat 2 --checkpoint-root s3://tessera-bench/cluster \
    --s3-endpoint "$TESSERA_S3_ENDPOINT" || true
  step s3_boto3_2 "$out/s3_boto3_2.jsonl" "${boto[@]}" || true
  bash tools/s3/rgw.sh stop "$rgw_dir" >/dev/null 2>&1 || true
  rm -rf "$rgw_dir"
  rgw_dir=""
}

if want storage; then
  fio_step fio_pass1
  step torch "$out/torch.jsonl" "$py" "$peers/save_torch.py" --dir "$tmp"
  step tessera "$out/tessera.jsonl" "$bench_bin" --dir "$tmp" --json --scale "$scale" \
    --repeat "$repeat"
  # The cluster: tesserad + 4 workers checkpointing ~1 GiB held in shared-memory mappings.
  step cluster "$out/cluster.jsonl" build-bench/bin/tessera_bench_cluster --dir "$tmp" \
    --scale "$scale" --repeat 3
  # Safetensors export (REST job and `tessera export`) against the save of the same state.
  rm -f "$out/export.jsonl"
  step export "$out/export.log" env TESSERA_BIN=build-bench/bin "$py" bench/export.py --runs 3 \
    --out "$out/export.jsonl" || true
  # A worker frozen mid-save (SIGSTOP): how long until the save fails, against the lease.
  rm -f "$out/worker_loss.jsonl"
  step worker_loss "$out/worker_loss.log" env TESSERA_BIN=build-bench/bin "$py" \
    bench/worker_loss.py --runs 3 --out "$out/worker_loss.jsonl" || true
  # The float codec against python3-blosc and plain zstd-1 on the same bytes.
  rm -f "$out/float_codec.jsonl"
  step float_codec "$out/float_codec.log" env TESSERA_BIN=build-bench/bin "$py" \
    bench/float_codec.py --out "$out/float_codec.jsonl" || true
  fio_step fio_pass2
  s3_part
  # Incremental saves against full ones, 1 GiB on one worker: a fine-tuning run (5 % of
  # the bytes change per step) and a pre-training run (all of them).
  rm -f "$out/incremental.json"
  step incremental "$out/incremental.log" env TESSERA_BIN=build-bench/bin "$py" \
    bench/incremental.py --dir "$tmp" --out "$out/incremental.json" || true
  # The memory tier against a memcpy, the POSIX root and S3, on namespace hosts.
  step memory_tier "$out/memory_tier.log" env TESSERA_BIN=build-bench/bin "$py" \
    bench/memory_tier.py --fresh --out "$out/memory_tier.jsonl" || true
  # PyTorch DCP through tessera.dcp against DCP's own writer, reader and stagers, with the
  # torch of the project's environment (.venv/, made by tools/venv.sh when missing).
  rm -f "$out/dcp.jsonl"
  bash tools/venv.sh
  step dcp "$out/dcp.log" env TESSERA_BIN=build-bench/bin .venv/bin/python bench/dcp.py \
    --dir "$tmp" --out-dir "$out" --results "" || true
  # JAX through tessera.jax against Orbax's CheckpointManager, both from .venv/.
  rm -f "$out/jax_orbax.jsonl"
  step jax_orbax "$out/jax_orbax.log" env TESSERA_BIN=build-bench/bin .venv/bin/python \
    bench/jax_orbax.py --dir "$tmp" --out-dir "$out" --results "" || true
fi

[ "$only" = s3 ] && s3_part

if want collectives; then
  # A failed run is reported (exit status in the steps table), not fatal: the other
  # runs still give medians. Ours: 4 forked ranks, a full TCP mesh on 127.0.0.1.
  coll=build-bench/bin/tessera_bench_collectives
  for ((i = 1; i <= rounds; i++)); do
    # A port of its own per run: the last run's TCPStore port may linger in TIME_WAIT.
    step "gloo$i" "$out/gloo$i.jsonl" "$py" "$peers/allreduce_torch_gloo.py" --ranks 4 \
      --port $((29510 + i)) || true
    # torch Gloo's sparse all_reduce, the peer of our sparse_all_reduce lines.
    step "sparse_gloo$i" "$out/sparse_gloo$i.jsonl" "$py" bench/sparse_torch_gloo.py --ranks 4 \
      --port $((29520 + i)) || true
    step "ours$((2 * i - 1))" "$out/ours$((2 * i - 1)).jsonl" "$coll" --ranks 4 --transport tcp ||
      true
    if [ "$have_mpi" = 1 ]; then
      step "mpi$i" "$out/mpi$i.jsonl" env NP=4 bash "$peers/allreduce_mpi.sh" || true
    else
      skip "mpi$i" "openmpi missing"
    fi
    step "ours$((2 * i))" "$out/ours$((2 * i)).jsonl" "$coll" --ranks 4 --transport tcp || true
  done
  # Context: the engine with ranks as threads over InProcessTransport (no sockets).
  step ours_inproc "$out/ours_inproc.jsonl" "$coll" --ranks 4 --transport inproc || true
  # tesserad's POST /api/v1/barriers/{name}, 4 client threads (its own tesserad).
  step rest_barrier "$out/rest_barrier.jsonl" build-bench/bin/tessera_bench_rest_barrier \
    --ranks 4 || true
fi
if want history; then
  # tesserad over a long run: TESSERA_BENCH_HISTORY_SAVES tiny saves, with job lists
  # polled meanwhile (bench/job_history.py); its summary goes to job_history.json.
  step history "$out/job_history.log" env TESSERA_BIN=build-bench/bin "$py" bench/job_history.py \
    --saves "$history_saves" --out "$out/job_history.json" || true
fi
finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)

results=bench/RESULTS.md
[ "$only" = all ] || results="$out/RESULTS.$only.md"
cmdline="bash bench/run.sh"
[ "$only" = all ] || cmdline="TESSERA_BENCH_ONLY=$only $cmdline"
"$py" bench/report.py --out "$out" --results "$results" --started "$started" \
  --finished "$finished" --command "$cmdline" --scale "$scale" --repeat "$repeat" \
  --only "$only" --rounds "$rounds" --targets "${targets[*]}"
echo "wrote $results" >&2
