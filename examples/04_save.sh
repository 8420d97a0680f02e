#!/usr/bin/env bash
# Save step ${1:-100}: returns at once with a job; 05_watch_job.sh follows it.
source "$(dirname "$0")/env.sh"
step=${1:-100}
api POST /api/v1/meshes/demo/checkpoints "{\"step\": $step, \"metadata\": {\"note\": \"from curl\"}}" |
  tee "$TESSERA_STATE/last_job.json" | jq -c .
jq -r .job "$TESSERA_STATE/last_job.json" > "$TESSERA_STATE/last_job"
