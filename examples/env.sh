# Shared by the examples: where tesserad is, its token, and a curl wrapper.
# The cluster started by 01_start_cluster.sh writes its address and token to
# $TESSERA_STATE (default /tmp/tessera-examples); other scripts read them.
set -euo pipefail
TESSERA_STATE=${TESSERA_STATE:-/tmp/tessera-examples}
if [ -z "${TESSERA_URL:-}" ] && [ -f "$TESSERA_STATE/url" ]; then TESSERA_URL=$(cat "$TESSERA_STATE/url"); fi
if [ -z "${TESSERA_TOKEN:-}" ] && [ -f "$TESSERA_STATE/token" ]; then TESSERA_TOKEN=$(cat "$TESSERA_STATE/token"); fi
TESSERA_URL=${TESSERA_URL:-http://127.0.0.1:7070}

# api METHOD PATH [JSON]: calls tesserad; prints the body; fails on an error status.
api() {
  local method=$1 path=$2 body=${3:-}
  local out code
  out=$(mktemp)
  code=$(curl -sS -o "$out" -w '%{http_code}' -X "$method" \
    -H "Authorization: Bearer $TESSERA_TOKEN" -H 'Content-Type: application/json' \
    ${body:+--data "$body"} "$TESSERA_URL$path")
  cat "$out"; echo
  rm -f "$out"
  [ "$code" -lt 400 ] || { echo "error: $method $path answered $code" >&2; return 1; }
}

# worker_url ID: the local API of a worker.
worker_url() { api GET "/api/v1/workers/$1" | jq -r .local_api; }

# wcurl [CURL ARGS...] URL: curl to a worker's local API (URL last), with the
# worker's local credential: a file only the worker's user can read, by default
# /tmp/tessera-<uid>/local-<port>.key (or $TESSERA_LOCAL_CREDENTIAL).
wcurl() {
  local url=${!#} port
  port=${url#*://*:}
  port=${port%%/*}
  local file=${TESSERA_LOCAL_CREDENTIAL:-/tmp/tessera-$(id -u)/local-$port.key}
  curl -H "Authorization: Bearer $(cat "$file")" "$@"
}
