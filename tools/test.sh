#!/usr/bin/env bash
# Set up, build and run the tests (ctest label `quick`, ≤ 20 min on 2 cores).
#   bash tools/test.sh              # the default tier
#   bash tools/test.sh --sanitize   # the same tests under ASan + UBSan (build-asan/)
#   bash tools/test.sh --tsan       # under ThreadSanitizer (build-tsan/)
#   LABEL=slow bash tools/test.sh   # the longer tier
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh "$@"
build_dir=build
case "${1:-}" in
  --sanitize) build_dir=build-asan ;;
  --tsan) build_dir=build-tsan ;;
esac
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build_dir" -L "${LABEL:-quick}" --output-on-failure -j2 --timeout 900
