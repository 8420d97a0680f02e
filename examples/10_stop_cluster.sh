#!/usr/bin/env bash
# Stop the cluster started by 01_start_cluster.sh and remove its state.
source "$(dirname "$0")/env.sh"
for f in "$TESSERA_STATE"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
sleep 0.3
rm -rf "$TESSERA_STATE"
echo "stopped"
