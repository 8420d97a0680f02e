#!/usr/bin/env bash
# A throwaway single-member etcd for tests (the HA tests elect tesserad's leader
# through it). Everything lives under one directory, so instances don't collide
# with each other or with a system etcd (Debian's etcd-server runs one on
# 127.0.0.1:2379 under systemd; pass 0 rather than that port).
#
#   env=$(bash tools/etcd/etcd.sh start DIR CLIENT_PORT [ADDR]) && eval "$env"   # port 0: a free one
#   bash tools/etcd/etcd.sh stop DIR
#
# start prints `export TESSERA_ETCD=etcd://ADDR:PORT` (also written to DIR/env) and
# nothing else on stdout; progress and errors go to stderr. See tools/etcd/README.md.
set -euo pipefail

# How long the member has to answer /health.
TIMEOUT=${TESSERA_ETCD_TIMEOUT:-30}
ETCD=${TESSERA_ETCD_BIN:-/usr/bin/etcd}
PY=/usr/bin/python3

log() { echo "etcd.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  echo "usage: $0 start DIR CLIENT_PORT [ADDR]   (CLIENT_PORT 0 picks a free one; the peer" \
       "port is CLIENT_PORT+1; ADDR defaults to 127.0.0.1)" >&2
  echo "       $0 stop DIR" >&2
  exit 2
}

# DIR made absolute: etcd gets it in its flags and outlives our working directory.
set_paths() {
  DIR=$(cd "$1" && pwd -P)
  DATA=$DIR/data
  PIDFILE=$DIR/etcd.pid
  LOG=$DIR/etcd.log
}

# True if the pid is alive and still the etcd of this DIR (a stale pid file may name
# a pid since given to another process): its command line has --data-dir DIR/data.
ours() {
  local pid=$1 args=() i
  [[ -n $pid ]] || return 1
  mapfile -d '' args 2>/dev/null <"/proc/$pid/cmdline" || return 1
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    [[ ${args[i]} == --data-dir && ${args[i + 1]} == "$DATA" ]] && return 0
  done
  return 1
}

pid_of() { cat "$PIDFILE" 2>/dev/null || true; }

# A client port whose successor (the peer port) is free too, on ADDR.
free_ports() {
  "$PY" - "$1" <<'EOF'
import socket, sys
addr = sys.argv[1]
for _ in range(100):
    with socket.socket() as a, socket.socket() as b:
        a.bind((addr, 0))
        port = a.getsockname()[1]
        try:
            b.bind((addr, port + 1))
        except OSError:
            continue
        print(port)
        sys.exit(0)
sys.exit("no two free consecutive ports on " + addr)
EOF
}

healthy() { curl -s --max-time 2 "http://$1/health" 2>/dev/null | grep -q '"health":"true"'; }

# Starts etcd on ADDR:PORT (peer PORT+1) and waits for /health; 0 if healthy, 1 if it
# exited (the log says why), 2 if the deadline passed.
launch() {
  local port=$1 peer=$(($1 + 1)) name deadline pid v unset=()
  name=$(basename "$DIR")
  # Flags only: etcd also reads ETCD_* variables, which the caller's environment may have.
  for v in $(compgen -e); do [[ $v != ETCD_* ]] || unset+=(-u "$v"); done
  env "${unset[@]}" "$ETCD" --name "$name" --data-dir "$DATA" \
    --listen-client-urls "http://$ADDR:$port" --advertise-client-urls "http://$ADDR:$port" \
    --listen-peer-urls "http://$ADDR:$peer" --initial-advertise-peer-urls "http://$ADDR:$peer" \
    --initial-cluster "$name=http://$ADDR:$peer" --initial-cluster-state new \
    --initial-cluster-token "$name" --logger zap --log-outputs "$LOG" \
    </dev/null >>"$DIR/etcd.out" 2>&1 &
  pid=$!
  echo "$pid" >"$PIDFILE"
  deadline=$((SECONDS + TIMEOUT))
  until healthy "$ADDR:$port"; do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" || true; return 1; }
    ((SECONDS < deadline)) || return 2
    sleep 0.1
  done
}

start() {
  [[ $# -ge 2 && $# -le 3 ]] || usage
  local port=$2 tries=1 rc=0
  ADDR=${3:-127.0.0.1}
  [[ $port =~ ^[0-9]+$ ]] || usage
  [[ -x $ETCD ]] || die "no $ETCD; install Debian's etcd-server and etcd-client (tools/setup.sh does)"
  mkdir -p "$1"
  set_paths "$1"
  ! ours "$(pid_of)" || die "an etcd of $DIR is running already (pid $(pid_of)); stop it first"
  rm -rf "$DATA" "$PIDFILE" "$LOG" "$DIR/etcd.out" "$DIR/env"
  # A picked port may be taken before etcd binds it: then pick again.
  ((port != 0)) || tries=3
  while ((tries-- > 0)); do
    local p=$port
    ((p != 0)) || p=$(free_ports "$ADDR")
    rc=0
    launch "$p" || rc=$?
    if ((rc == 0)); then
      echo "export TESSERA_ETCD=etcd://$ADDR:$p" | tee "$DIR/env"
      log "etcd $(basename "$DIR") serves http://$ADDR:$p (pid $(pid_of), log $LOG)"
      return 0
    fi
    stop_pid
    if ((rc == 1)) && ((tries > 0)) && grep -qs "address already in use" "$LOG" "$DIR/etcd.out"; then
      log "port $p was taken meanwhile; picking another"
      rm -rf "$DATA" "$LOG" "$DIR/etcd.out"
      continue
    fi
    break
  done
  if ((rc == 1)); then log "error: etcd exited during its start; the last lines of $LOG:"
  else log "error: etcd did not answer http://$ADDR:$p/health within $TIMEOUT s; the last lines of $LOG:"; fi
  tail -n 30 "$LOG" >&2 2>/dev/null || true
  # etcd's own stdout and stderr: only what it wrote before its logger was set up.
  [[ ! -s $DIR/etcd.out ]] || { log "and of $DIR/etcd.out:"; tail -n 30 "$DIR/etcd.out" >&2; }
  exit 1
}

# SIGTERM to our etcd, SIGKILL after 15 s; returns once it is gone.
stop_pid() {
  local pid i
  pid=$(pid_of)
  if ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      ours "$pid" || break
      sleep 0.1
    done
    if ours "$pid"; then
      log "etcd (pid $pid) ignored SIGTERM for 15 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      while ours "$pid"; do sleep 0.1; done
    fi
  fi
  rm -f "$PIDFILE"
}

stop() {
  [[ $# -eq 1 ]] || usage
  [[ -d $1 ]] || return 0
  set_paths "$1"
  stop_pid
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) usage ;;
esac
