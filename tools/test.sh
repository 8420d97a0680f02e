#!/usr/bin/env bash
# Set up, build and run the tests (ctest label `quick`, and `multihost` and `s3` as root; ≤ 20 min on 2 cores),
# then the clang build (build-clang/), which fails on any violation of the locking
# annotations (-Wthread-safety), and the fuzz tier: the libFuzzer targets of fuzz/, run
# for a bounded time each under ASan + UBSan (ctest label `fuzz`, about a minute).
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
# Quoted for the sanitizer's parser, which splits at spaces and colons.
export TSAN_OPTIONS=${TSAN_OPTIONS:-"suppressions='$PWD/tools/tsan.supp'"}
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
status=0
ctest --test-dir "$build_dir" -L "$label" --output-on-failure -j2 --timeout 900 || status=$?

# The clang build (build-clang/): every clang-only option is set here, in one place.
clang_build() {
  cmake -S . -B build-clang -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON >/dev/null
  cmake --build build-clang -j"$(nproc)"
}
if command -v clang++ >/dev/null; then
  echo "test: the fuzz tier (build-clang/, ctest label fuzz)"
  if clang_build; then
    ctest --test-dir build-clang -L fuzz --output-on-failure -j2 --timeout 900 || status=$?
  else
    echo "test: the clang build (build-clang/) failed" >&2
    status=1
  fi
else
  echo "NOTE: clang++ is not installed, so the fuzz tier (libFuzzer targets in build-clang/) was" \
       "skipped; tools/setup.sh installs clang and libclang-rt-14-dev" >&2
fi
exit "$status"
