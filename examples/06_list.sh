#!/usr/bin/env bash
# List checkpoints (newest first), the latest one, and one in detail.
source "$(dirname "$0")/env.sh"
api GET /api/v1/meshes/demo/checkpoints | jq -r '.[] | "step \(.step)  \(.state)  \(.logical_bytes) B logical  \(.stored_bytes) B stored"'
api GET /api/v1/meshes/demo/checkpoints/latest | jq -c '{step, state, tensors: [.tensors[].name], metadata}'
