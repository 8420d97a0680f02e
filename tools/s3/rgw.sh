#!/usr/bin/env bash
# A throwaway single-node Ceph cluster (one monitor, one memstore OSD) with a RADOS
# Gateway, so the S3 checkpoint store can be tested against a real S3 server on
# 127.0.0.1. Everything lives under one directory, so instances don't collide with
# each other or with a system Ceph.
#
#   env=$(bash tools/s3/rgw.sh start DIR [PORT]) && eval "$env"   # PORT 0: a free one
#   bash tools/s3/rgw.sh stop DIR
#
# start prints `export VAR=...` lines (also written to DIR/env) and nothing else on
# stdout; progress and errors go to stderr. (Not `eval "$(... start ...)"`: eval of
# the empty output of a failed start succeeds.) See tools/s3/README.md.
set -euo pipefail

# Per-daemon startup limit; a cold monitor, OSD and gateway each need a few seconds.
TIMEOUT=${TESSERA_RGW_TIMEOUT:-60}
# The address the gateway listens on (the monitor and OSD stay on 127.0.0.1): a
# bridge's address makes it reachable from network namespaces on that bridge.
ADDR=${TESSERA_RGW_ADDR:-127.0.0.1}
# What the memstore OSD holds at most (it lives in memory).
STORE_BYTES=${TESSERA_RGW_STORE_BYTES:-2147483648}
# ceph-common depends on Debian's python3; a pyenv shim earlier in PATH may not have
# what we use, so name it.
PY=/usr/bin/python3
PACKAGES=(ceph-mon ceph-osd radosgw ceph-common)
TOOLS=(ceph-mon ceph-osd radosgw radosgw-admin ceph ceph-authtool monmaptool)
# Start order; stop goes the other way so the gateway never sees its OSD vanish first.
DAEMONS=(mon.a osd.0 client.rgw.a)

log() { echo "rgw.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  echo "usage: $0 start DIR [PORT]   (PORT defaults to 7480; 0 picks a free port)" >&2
  echo "       $0 stop DIR" >&2
  exit 2
}

ensure_packages() {
  local t missing=()
  for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null || missing+=("$t"); done
  [[ -x $PY ]] || missing+=("$PY")
  ((${#missing[@]} == 0)) && return
  ((EUID == 0)) || die "missing ${missing[*]}; as root run: apt-get install --no-install-recommends ${PACKAGES[*]}"
  log "installing ${PACKAGES[*]} (missing: ${missing[*]})"
  # A fresh machine may have no package lists yet; only pay for the update then.
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}" >&2 ||
    { apt-get update >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}" >&2; }
}

# Paths of one instance. DIR is made absolute because the daemons get it through the
# config file and outlive this shell's working directory.
set_paths() {
  DIR=$(cd "$1" && pwd -P)
  CONF=$DIR/ceph.conf
  RUN=$DIR/run
  LOGS=$DIR/log
  KEYS=$DIR/keyring
}

pid_of() { cat "$RUN/$1.pid" 2>/dev/null || true; }

# True if the pid is alive and still the daemon we started for this DIR: a stale pid
# file may name a pid the kernel has since given to an unrelated process.
# Matched in bash itself: a grep given the path would match its own command line.
ours() {
  local pid=$1 args=() i
  [[ -n $pid ]] || return 1
  mapfile -d '' args 2>/dev/null <"/proc/$pid/cmdline" || return 1
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    [[ ${args[i]} == -c && ${args[i + 1]} == "$CONF" ]] && return 0
  done
  return 1
}

alive() { ours "$(pid_of "$1")"; }

# Every process still using this DIR's config: daemons whose pid file went missing,
# and ceph/radosgw-admin clients left behind by an interrupted start.
stragglers() {
  local p
  for p in /proc/[0-9]*; do
    [[ ${p#/proc/} != "$$" ]] && ours "${p#/proc/}" && echo "${p#/proc/}"
  done
  return 0
}

living() { local pid; for pid; do ours "$pid" && echo "$pid"; done; return 0; }

# SIGTERM, then SIGKILL for what is still there after 15 s: the data is throwaway.
terminate() { # pids...
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  local deadline=$((SECONDS + 15)) killed="" left=()
  while mapfile -t left < <(living "$@") && ((${#left[@]})); do
    if ((SECONDS >= deadline)); then
      [[ -z $killed ]] || die "processes ${left[*]} for $DIR did not exit"
      log "killing ${left[*]} (no exit 15 s after SIGTERM)"
      kill -KILL "${left[@]}" 2>/dev/null || true
      killed=1 deadline=$((SECONDS + 5))
    fi
    sleep 0.1
  done
}

stop_dir() {
  local i name pid rest=()
  # One at a time, gateway first: a stopping OSD waits up to 5 s for the monitor to
  # acknowledge, so the monitor must outlive it.
  for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
    name=${DAEMONS[i]}
    pid=$(pid_of "$name")
    ours "$pid" && terminate "$pid"
    rm -f "$RUN/$name.pid"
  done
  mapfile -t rest < <(stragglers)
  ((${#rest[@]})) || return 0
  for pid in "${rest[@]}"; do
    log "stopping leftover process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)"
  done
  terminate "${rest[@]}"
}

# A port is taken if we cannot bind it. SO_REUSEADDR as the daemons use it, so a port
# in TIME_WAIT from the previous run still counts as free.
port_free() {
  "$PY" - "$1" "${2:-127.0.0.1}" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((sys.argv[2], int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

random_key() { # length, alphabet
  "$PY" -c 'import secrets, sys; print("".join(secrets.choice(sys.argv[2]) for _ in range(int(sys.argv[1]))))' "$1" "$2"
}

# The CLI gets its own bound: it retries an unreachable monitor forever.
ceph_cli() { timeout 20 ceph -c "$CONF" --connect-timeout 15 "$@"; }

# Daemons run in the foreground (-f) under setsid: we know their pid without
# parsing pid files they write later, and they leave this script's session, so a
# Ctrl-C of the caller does not reach them. They must hold no descriptor of ours
# (fd 3 is the caller's stdout, and it may have passed others): a `$(... start)`
# waits until every writer of its pipe has closed it.
detach() { # name command...
  local name=$1 fd
  shift
  for fd in "/proc/$BASHPID/fd/"*; do
    fd=${fd##*/}
    ((fd > 2)) && eval "exec $fd>&-"
  done
  # No fork here (a background job is not a group leader), so $! is the daemon.
  exec setsid "$@" -c "$CONF" -f </dev/null >"$LOGS/$name.out" 2>&1
}

# Until it execs the daemon, the background child is a copy of this shell: its command
# line is ours, so `alive` would call it dead. Wait for the exec (or for the child to
# end: a zombie's command line is empty too, and its state says so).
launch() { # name command...
  detach "$@" &
  local pid=$! state
  echo "$pid" >"$RUN/$1.pid"
  until ours "$pid"; do
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$pid/status" 2>/dev/null || true)
    [[ -n $state && $state != Z ]] || return 0
    sleep 0.02
  done
}

fail_daemon() { # name what why
  local log=$LOGS/$1.log
  log "error: $2 ($1) $3; its log is $log (stdout/stderr: $LOGS/$1.out). Last lines:"
  tail -n 15 "$log" "$LOGS/$1.out" >&2 2>/dev/null || true
  exit 1
}

wait_for() { # name what check...
  local name=$1 what=$2 deadline=$((SECONDS + TIMEOUT))
  shift 2
  # In a subshell: a redirected function call silences the shell itself while it
  # runs, and so the EXIT trap, should a signal end the script then.
  until ("$@") >/dev/null 2>&1; do
    alive "$name" || fail_daemon "$name" "$what" "exited during startup"
    ((SECONDS < deadline)) || fail_daemon "$name" "$what" "did not come up within ${TIMEOUT}s"
    sleep 0.2
  done
}

mon_up() { ceph_cli mon stat; }
osd_up() { ceph_cli osd stat -f json | grep -q '"num_up_osds":1'; }

# Any HTTP status line will do: anonymous GET / is answered by RGW with 200 and an
# empty bucket list. bash's /dev/tcp spares a dependency on curl.
http_up() {
  local fd line=
  exec {fd}<>"/dev/tcp/$ADDR/$1" || return 1
  printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$ADDR" >&"$fd"
  IFS= read -r -t 5 line <&"$fd" || true
  # Drain the rest, or RGW logs the early close as an error.
  read -r -t 5 -d '' _ <&"$fd" || true
  exec {fd}>&-
  [[ $line == HTTP/1.?\ * ]]
}

# Start refuses a directory it did not make, so a typo cannot wipe someone's files;
# one of its own (stopped, or left by a failed start) is reset, so start/stop/start
# with the same DIR works.
prepare_dir() {
  mkdir -p "$1"
  set_paths "$1"
  if [[ -f $DIR/.rgw.sh ]]; then
    local n
    for n in "${DAEMONS[@]}"; do
      alive "$n" && die "$DIR is running ($n, pid $(pid_of "$n")); run: $0 stop $DIR"
    done
    [[ -z $(stragglers) ]] || die "processes of a previous start still use $DIR; run: $0 stop $DIR"
    rm -rf "$DIR/.rgw.sh" "$CONF" "$DIR/env" "$DIR/monmap" "$KEYS" "$DIR/mon" "$DIR/osd" "$DIR/rgw" "$LOGS" "$RUN" "$DIR/crash"
  elif [[ -n $(ls -A "$DIR") ]]; then
    die "$DIR is not empty and was not made by this script; give a new or empty directory"
  fi
  echo "made by tools/s3/rgw.sh start; removed by the next start in this directory" >"$DIR/.rgw.sh"
  mkdir -p "$KEYS" "$DIR/mon" "$DIR/osd/osd.0" "$DIR/rgw" "$LOGS" "$RUN" "$DIR/crash"
}

write_conf() { # mon port, rgw port
  # Unix sockets are limited to 107 bytes; a client's admin socket name carries its
  # pid and a context id. Rather than fail deep in a daemon, go without them.
  local asok=""
  ((${#RUN} + 48 < 107)) || asok="admin socket ="
  cat >"$CONF" <<EOF
[global]
fsid = $(cat /proc/sys/kernel/random/uuid)
# Only msgr2, on a port of our own, so two instances never share a monitor address.
mon host = [v2:127.0.0.1:$1]
mon initial members = a
ms bind msgr1 = false
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
# Everything a daemon or the CLI would put under /etc/ceph, /var/lib/ceph, /var/run/ceph
# or /var/log/ceph goes under DIR instead.
keyring = $KEYS/\$name.keyring
run dir = $RUN
crash dir = $DIR/crash
log file = $LOGS/\$name.log
mon cluster log file = $LOGS/cluster.log
$asok

# One OSD: every pool has a single replica, and CRUSH must place it on an OSD rather
# than look for distinct hosts. Few PGs keep pool creation (RGW makes ~7 pools) quick.
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd crush chooseleaf type = 0
osd pool default pg num = 8
osd pool default pgp num = 8
# No manager daemon runs; nothing would act on the autoscaler, and it only warns.
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
mon allow pool delete = true
# Warnings that are the point of this setup, or irrelevant on a private loopback cluster.
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
# The monitor warns below 30% free disk and shuts itself down below 5%; a fairly full
# CI disk should neither make noise nor turn into a vanished endpoint.
mon data avail warn = 2
mon data avail crit = 1
# Each map change (OSD boot, CRUSH placement, each of RGW's pool creations) waits out
# this batching interval; 1 s by default, it is most of the startup time.
paxos propose interval = 0.1

[mon]
mon data = $DIR/mon/\$name
# ceph-mon --mkfs copies its keyring here; this is Ceph's own default for monitors.
keyring = \$mon_data/keyring

[osd]
osd data = $DIR/osd/\$name
# Objects live in memory: no disk, no block device, and an idle OSD is small. The size
# is only a cap on what the OSD reports (and accepts) as capacity.
osd objectstore = memstore
# Unused by memstore, but otherwise logged as a path under /var/lib/ceph.
osd journal = \$osd_data/journal
memstore device bytes = $STORE_BYTES
# Ceph derives the CRUSH weight from the size in TiB; 2 GiB would be a tiny weight.
osd crush initial weight = 1

[client.rgw.a]
rgw frontends = beast endpoint=$ADDR:$2
rgw data = $DIR/rgw
# The default pool of 512 request threads is for production; tests need a few dozen.
rgw thread pool size = 64
# Deleted objects are collected after 2 hours by default: far longer than a test run,
# during which they would pile up in the OSD's memory, and a full OSD blocks every
# write (Ceph holds them rather than failing them). Reclaim within seconds.
rgw gc obj min wait = 5
rgw gc processor period = 5
EOF
}

cmd_start() {
  [[ $# -ge 1 && $# -le 2 ]] || usage
  local port=${2:-7480} mon_port t0=$SECONDS
  [[ $port =~ ^[0-9]+$ ]] || usage
  # From here on stdout is stderr; only the final env lines go to the caller's stdout.
  exec 3>&1 1>&2
  ensure_packages
  prepare_dir "$1"

  if ((port == 0)); then
    port=$(free_port)
  else
    port_free "$port" "$ADDR" || die "port $port on $ADDR is in use (pass 0 to pick a free one)"
  fi
  # Nothing holds a picked port until its daemon binds it, so the two could coincide.
  mon_port=$(free_port)
  while ((mon_port == port)); do mon_port=$(free_port); done
  write_conf "$mon_port" "$port"
  log "starting in $DIR (monitor 127.0.0.1:$mon_port, S3 $ADDR:$port)"

  # Whatever fails from here on, take down what was started.
  trap 'rc=$?; if ((rc)); then log "start failed; stopping $DIR"; stop_dir || true; fi' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  # Monitor: its own key, plus client.admin's so the CLI can talk to it from the start.
  ceph-authtool --create-keyring "$KEYS/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$KEYS/client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$KEYS/mon.keyring" --import-keyring "$KEYS/client.admin.keyring" >/dev/null
  local fsid
  fsid=$(sed -n 's/^fsid = //p' "$CONF")
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$KEYS/mon.keyring"
  launch mon.a ceph-mon -i a
  wait_for mon.a "monitor" mon_up
  log "monitor up ($((SECONDS - t0))s)"

  # OSD: the monitor must know its key (ceph osd new) before the OSD can authenticate.
  local uuid secret id
  uuid=$(cat /proc/sys/kernel/random/uuid)
  secret=$(ceph-authtool --gen-print-key)
  id=$(echo "{\"cephx_secret\": \"$secret\"}" | ceph_cli osd new "$uuid" -i -)
  [[ $id == 0 ]] || die "ceph osd new gave OSD id '$id', expected 0"
  ceph-authtool --create-keyring "$KEYS/osd.0.keyring" -n osd.0 --add-key "$secret" >/dev/null
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid" >"$LOGS/osd.0.mkfs.out" 2>&1 ||
    { cat "$LOGS/osd.0.mkfs.out"; die "ceph-osd --mkfs failed; see $LOGS/osd.0.log"; }
  launch osd.0 ceph-osd -i 0
  wait_for osd.0 "OSD" osd_up
  log "OSD up ($((SECONDS - t0))s)"

  # Gateway: it creates its pools itself on first start.
  ceph_cli auth get-or-create client.rgw.a mon 'allow rw' osd 'allow rwx' mgr 'allow rw' \
    -o "$KEYS/client.rgw.a.keyring"
  launch client.rgw.a radosgw -n client.rgw.a
  wait_for client.rgw.a "radosgw" http_up "$port"
  log "radosgw up ($((SECONDS - t0))s)"

  local access secret_key
  access=$(random_key 20 ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789)
  secret_key=$(random_key 40 ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789)
  timeout 60 radosgw-admin -c "$CONF" user create --uid=tessera --display-name=Tessera \
    --access-key="$access" --secret-key="$secret_key" >/dev/null ||
    die "radosgw-admin user create failed; see $LOGS/client.admin.log"

  # AWS_DEFAULT_REGION too: botocore and the AWS CLI v1 read only that one.
  cat >"$DIR/env" <<EOF
export TESSERA_S3_ENDPOINT=http://$ADDR:$port
export AWS_ACCESS_KEY_ID=$access
export AWS_SECRET_ACCESS_KEY=$secret_key
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
EOF
  log "ready in $((SECONDS - t0))s: S3 on http://$ADDR:$port; stop with: $0 stop $DIR"
  cat "$DIR/env" >&3
}

cmd_stop() {
  [[ $# -eq 1 ]] || usage
  # Nothing to stop in a directory that is not there.
  [[ -d $1 ]] || return 0
  set_paths "$1"
  stop_dir
}

# Sourced (tests/s3/rgw_launch_test.sh): the functions only.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) usage ;;
esac
