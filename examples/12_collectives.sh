#!/usr/bin/env bash
# Collectives, two ways.
# 1. As a trainer: every worker of the mesh makes the same SPMD call on its local
#    API at the same time. Here each device contributes float32 [d, 1] and the
#    all-reduce runs along "data" (devices {0,2} and {1,3} of mesh demo).
# 2. Over REST: a job on tensors the workers already hold (layer0/w from
#    03_push_tensors.sh), gathering its first dimension, which is sharded on "data".
# 3. A sparse all-reduce (an embedding's gradient as indexed slices): device d
#    sends d+1 rows of ones for rows d, d+1, ... of a [6, 2] tensor, then their
#    int64 row ids. The row counts differ, so the workers densify and all-reduce.
source "$(dirname "$0")/env.sh"
pids=()
while read -r device worker; do
  /usr/bin/python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<2f', $device, 1))" \
    > "$TESSERA_STATE/in.$device"
  wcurl -sS -f -X POST --data-binary @"$TESSERA_STATE/in.$device" -o "$TESSERA_STATE/out.$device" \
    "$(worker_url "$worker")/v1/collectives/all_reduce?mesh=demo&axes=data&dtype=float32&shape=2&reduce=sum" &
  pids+=($!)
done < <(api GET /api/v1/meshes/demo | jq -r '.devices[] | "\(.device) \(.worker)"')
for p in "${pids[@]}"; do wait "$p"; done
for device in 0 1 2 3; do
  echo "device $device: all_reduce along data = $(/usr/bin/python3 -c "import struct; print(struct.unpack('<2f', open('$TESSERA_STATE/out.$device','rb').read()))")"
done
# The same barrier on every worker (sync_global_devices): all four must arrive.
pids=()
while read -r worker; do
  wcurl -sS -f -X POST -d '{}' "$(worker_url "$worker")/v1/barriers/after-step-1?mesh=demo" > /dev/null &
  pids+=($!)
done < <(api GET /api/v1/meshes/demo | jq -r '.workers[]')
for p in "${pids[@]}"; do wait "$p"; done
echo "barrier after-step-1: all workers arrived"

pids=()
while read -r device worker; do
  /usr/bin/python3 -c "import struct,sys; n=$device+1; sys.stdout.buffer.write(
    struct.pack('<%df' % (2*n), *[1.0]*(2*n)) + struct.pack('<%dq' % n, *[($device+i)%6 for i in range(n)]))" \
    > "$TESSERA_STATE/sparse.$device"
  wcurl -sS -f -X POST --data-binary @"$TESSERA_STATE/sparse.$device" -D "$TESSERA_STATE/sparse-headers.$device" \
    -o "$TESSERA_STATE/sparse-out.$device" \
    "$(worker_url "$worker")/v1/collectives/sparse_all_reduce?mesh=demo&dtype=float32&dense_shape=6,2&rows=$((device + 1))" &
  pids+=($!)
done < <(api GET /api/v1/meshes/demo | jq -r '.devices[] | "\(.device) \(.worker)"')
for p in "${pids[@]}"; do wait "$p"; done
path=$(grep -i '^x-tessera-sparse-path' "$TESSERA_STATE/sparse-headers.0" | tr -d '\r' | cut -d' ' -f2)
echo "sparse_all_reduce took the $path path; rows of the sum: $(/usr/bin/python3 -c "import struct; print(struct.unpack('<12f', open('$TESSERA_STATE/sparse-out.0','rb').read()[:48])[::2])")"

job=$(api POST /api/v1/meshes/demo/collectives \
  '{"op":"all_gather","tensor":"layer0/w","output":"layer0/w_rows","axes":["data"],"tiled":true}' | jq -r .job)
api GET "/api/v1/jobs/$job?wait_ms=30000" | jq -c '{state, result}'
