#!/usr/bin/env bash
# Start a local cluster: tesserad + 4 workers on 127.0.0.1 (ports chosen freely).
source "$(dirname "$0")/env.sh"
BIN=${TESSERA_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
mkdir -p "$TESSERA_STATE"
# The token travels in a 0600 file, never on a command line (which every local user can read).
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$TESSERA_STATE/token")
token=$(cat "$TESSERA_STATE/token")
"$BIN/tesserad" --listen 127.0.0.1:0 --data-dir "$TESSERA_STATE/data" \
  --token-file "$TESSERA_STATE/token" > "$TESSERA_STATE/tesserad.log" 2>&1 &
echo $! > "$TESSERA_STATE/tesserad.pid"
for _ in $(seq 100); do grep -q 'listening on' "$TESSERA_STATE/tesserad.log" && break; sleep 0.05; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$TESSERA_STATE/tesserad.log" | head -1)
echo "$url" > "$TESSERA_STATE/url"
for i in 0 1 2 3; do
  "$BIN/tessera-worker" --server "$url" --token-file "$TESSERA_STATE/token" --name "host$i" \
    > "$TESSERA_STATE/worker$i.log" 2>&1 &
  echo $! > "$TESSERA_STATE/worker$i.pid"
done
export TESSERA_URL=$url TESSERA_TOKEN=$token
for _ in $(seq 200); do
  [ "$(api GET /api/v1/cluster | jq .workers.alive)" = 4 ] && break; sleep 0.05
done
echo "tesserad at $url (token in $TESSERA_STATE/token); workers:"
api GET /api/v1/workers | jq -r '.[] | "  \(.id)  \(.state)  \(.local_api)"'
