#!/usr/bin/env bash
# Runs every example in order against a fresh cluster (the test suite does this).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export TESSERA_STATE=${TESSERA_STATE:-$(mktemp -d /tmp/tessera-examples-XXXXXX)}
trap '"$here/10_stop_cluster.sh" > /dev/null 2>&1 || true' EXIT
for s in 01_start_cluster 02_register_mesh 03_push_tensors 04_save 05_watch_job 06_list \
         07_restore 08_verify 09_retention 11_coordination 12_collectives; do
  echo "== $s"
  "$here/$s.sh"
done
echo "== all examples ran"
