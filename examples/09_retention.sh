#!/usr/bin/env bash
# Keep the last 2 checkpoints (and every 1000th step): older ones are deleted.
source "$(dirname "$0")/env.sh"
here=$(dirname "$0")
api PUT /api/v1/meshes/demo/retention '{"keep_last": 2, "keep_every_n_steps": 1000}' | jq -c .
for step in 200 300; do "$here/04_save.sh" "$step" > /dev/null; "$here/05_watch_job.sh" > /dev/null; done
api GET /api/v1/meshes/demo/checkpoints | jq -r '[.[].step] | "kept steps: \(.)"'
