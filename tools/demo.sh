#!/usr/bin/env bash
# The main job: set up, build, and run `tessera demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh >&2
exec build/bin/tessera demo "$@"
