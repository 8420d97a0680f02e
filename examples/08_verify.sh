#!/usr/bin/env bash
# Verify every chunk of the latest checkpoint.
source "$(dirname "$0")/env.sh"
api POST /api/v1/meshes/demo/checkpoints/latest/verify '{}' | jq -r .job > "$TESSERA_STATE/last_job"
"$(dirname "$0")/05_watch_job.sh"
api GET "/api/v1/jobs/$(cat "$TESSERA_STATE/last_job")" | jq -c '.result | {ok, chunks_checked, bad_chunks}'
