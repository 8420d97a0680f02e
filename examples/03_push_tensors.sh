#!/usr/bin/env bash
# Push tensors as a trainer would: each worker gets the local shard of each of
# its devices. "w" is float32[8,4] sharded over both axes (a 4x2 block per
# device); "bias" is float32[8] replicated (the whole tensor on every device).
source "$(dirname "$0")/env.sh"
api GET /api/v1/meshes/demo | jq -r '.devices[] | "\(.device) \(.worker)"' |
while read -r device worker; do
  local_api=$(worker_url "$worker")
  head -c 32 /dev/urandom > "$TESSERA_STATE/w.$device"    # 4x2 float32
  head -c 32 /dev/urandom > "$TESSERA_STATE/bias.$device" # 8 float32
  wcurl -sS -f -X PUT --data-binary @"$TESSERA_STATE/w.$device" \
    "$local_api/v1/tensors/layer0/w?mesh=demo&device=$device&dtype=float32&shape=8,4&layout=data,model"
  wcurl -sS -f -X PUT --data-binary @"$TESSERA_STATE/bias.0" \
    "$local_api/v1/tensors/layer0/bias?mesh=demo&device=$device&dtype=float32&shape=8&layout=unsharded"
  echo "device $device on $worker: pushed layer0/w and layer0/bias"
done
wcurl -sS "$(worker_url w-host0)/v1/tensors" | jq -c '.[]'
