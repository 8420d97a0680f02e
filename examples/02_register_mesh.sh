#!/usr/bin/env bash
# Register a {data:2, model:2} mesh over the 4 workers (idempotent: run it twice).
source "$(dirname "$0")/env.sh"
mesh='{"axes":[{"name":"data","size":2},{"name":"model","size":2}],
       "workers":["w-host0","w-host1","w-host2","w-host3"]}'
api PUT /api/v1/meshes/demo "$mesh" | jq -c '{name, axes, devices: [.devices[] | {device, worker}]}'
api PUT /api/v1/meshes/demo "$mesh" > /dev/null && echo "registered again: same definition, 200"
