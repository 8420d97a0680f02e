#!/usr/bin/env bash
# Coordination: 4 ranks meet at a barrier (and one that waits alone gets 504),
# a reader blocks on a KV key until a writer publishes it, and after a
# preemption notice the 4 workers of mesh demo agree on a sync step.
source "$(dirname "$0")/env.sh"
auth="Authorization: Bearer $TESSERA_TOKEN"

# Barrier: every rank blocks until all 4 have arrived (one process per rank in a real job).
pids=()
for rank in 0 1 2 3; do
  api POST /api/v1/barriers/demo/ready "{\"rank\": $rank, \"world\": 4, \"timeout_ms\": 10000}" \
    > "$TESSERA_STATE/barrier-$rank.json" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for rank in 0 1 2 3; do
  jq -r "\"rank $rank released: generation \(.generation), waited \(.waited_ms) ms\"" "$TESSERA_STATE/barrier-$rank.json"
done
# A rank alone at a barrier of 2 times out: 504, naming the ranks that never came.
curl -sS -X POST -H "$auth" -d '{"rank": 0, "world": 2, "timeout_ms": 200}' \
  "$TESSERA_URL/api/v1/barriers/demo/alone" | jq -c '.error | {code, missing_ranks: .details.missing_ranks}'

# KV: the reader waits up to 10 s for the key; the writer stores any bytes (≤ 1 MiB).
curl -sS -f -H "$auth" "$TESSERA_URL/api/v1/kv/demo/coordinator?wait_ms=10000" > "$TESSERA_STATE/kv-read" &
reader=$!
# Write only once tesserad counts the read as waiting (gauge tessera_kv_waiting_gets).
waiting() {
  curl -sS "$TESSERA_URL/metrics" | awk '$1 == "tessera_kv_waiting_gets" && $2 >= 1 { w = 1 } END { exit !w }'
}
for ((i = 0; i < 100; i++)); do
  waiting && break
  kill -0 "$reader" 2> /dev/null || { echo "error: the KV read returned before the key was written" >&2; exit 1; }
  sleep 0.1
done
waiting || { echo "error: the KV read never blocked (tessera_kv_waiting_gets stayed 0)" >&2; exit 1; }
curl -sS -f -X PUT -H "$auth" -H 'Content-Type: application/octet-stream' \
  --data-binary '10.0.0.1:29500' "$TESSERA_URL/api/v1/kv/demo/coordinator"
wait "$reader"
[ "$(cat "$TESSERA_STATE/kv-read")" = "10.0.0.1:29500" ] ||
  { echo "error: the blocked reader got '$(cat "$TESSERA_STATE/kv-read")', not the value written" >&2; exit 1; }
echo "reader got: $(cat "$TESSERA_STATE/kv-read")"
api GET '/api/v1/kv?prefix=demo/' | jq -c .
api DELETE /api/v1/kv/demo/coordinator > /dev/null && echo "deleted demo/coordinator"

# Preemption: a notice, then each trainer asks its worker at the step it reached
# (reached_preemption_sync_point); all get the same sync step, max + 1 = 8, and
# "sync" is true only for a trainer at that step.
api POST /api/v1/meshes/demo/preemption '{"reason": "maintenance"}' | jq -c '{noticed, reason, sync_step}'
pids=()
steps=(5 7 6 7)
for i in 0 1 2 3; do
  wcurl -sS -f "$(worker_url "w-host$i")/v1/preemption?mesh=demo&step=${steps[$i]}" \
    > "$TESSERA_STATE/sync-$i.json" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for i in 0 1 2 3; do
  jq -r "\"w-host$i at step ${steps[$i]}: sync \(.sync), sync step \(.sync_step)\"" "$TESSERA_STATE/sync-$i.json"
done
echo "w-host0 at step 8: $(wcurl -sS -f "$(worker_url w-host0)/v1/preemption?mesh=demo&step=8")"
api GET /api/v1/meshes/demo/preemption | jq -c '{noticed, sync_step, reported_steps}'
api DELETE /api/v1/meshes/demo/preemption > /dev/null && echo "notice cleared for the restarted job"
