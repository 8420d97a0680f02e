#!/usr/bin/env bash
# Watch a job (default: the last one started) until it ends, long-polling.
source "$(dirname "$0")/env.sh"
job=${1:-$(cat "$TESSERA_STATE/last_job")}
while true; do
  j=$(api GET "/api/v1/jobs/$job?wait_ms=2000")
  echo "$j" | jq -r '"\(.kind) \(.state) phase=\(.phase) \(.progress.done_bytes)/\(.progress.total_bytes) bytes"'
  case $(echo "$j" | jq -r .state) in
    succeeded) exit 0 ;;
    failed|cancelled) echo "$j" | jq .error >&2; exit 1 ;;
  esac
done
