#!/usr/bin/env bash
# Set up, build and run the tests (ctest label `quick`, and `multihost` and `s3` as root; ≤ 20 min on 2 cores).
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
label=${LABEL:-quick}
if [[ -z "${LABEL:-}" ]]; then
  # Hosts in network and mount namespaces, and the Ceph daemons behind the S3 tests,
  # need root; without it, say so and go on.
  if [[ $(id -u) -eq 0 ]]; then
    label="quick|multihost|s3"
  else
    echo "NOTE: not root, so the multihost tier (hosts in network namespaces) and the s3" \
         "tier (a Ceph RGW) are skipped; run as root to include them" >&2
  fi
fi
ctest --test-dir "$build_dir" -L "$label" --output-on-failure -j2 --timeout 900
