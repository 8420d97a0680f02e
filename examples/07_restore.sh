#!/usr/bin/env bash
# Restore the latest checkpoint onto the same mesh, then reshard it onto {data:4}.
source "$(dirname "$0")/env.sh"
here=$(dirname "$0")
api POST /api/v1/meshes/demo/checkpoints/latest/restore '{}' | jq -r .job > "$TESSERA_STATE/last_job"
"$here/05_watch_job.sh"
# The restored shard of device 0 equals what was pushed.
local0=$(worker_url "$(api GET /api/v1/meshes/demo | jq -r '.devices[0].worker')")
wcurl -sS "$local0/v1/tensors/layer0/w?mesh=demo&device=0" | cmp - "$TESSERA_STATE/w.0" && echo "device 0 restored byte for byte"
api PUT /api/v1/meshes/data4 '{"axes":[{"name":"data","size":4}],"workers":["w-host0","w-host1","w-host2","w-host3"]}' > /dev/null
api POST /api/v1/meshes/demo/checkpoints/latest/restore \
  '{"target_mesh":"data4","tensors":["layer0/w"],"layouts":{"layer0/w":["data","unsharded"]}}' |
  jq -r .job > "$TESSERA_STATE/last_job"
"$here/05_watch_job.sh"
wcurl -sS -D - -o /dev/null "$(worker_url w-host1)/v1/tensors/layer0/w?mesh=data4&device=1" | grep -i x-tessera
