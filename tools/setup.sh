#!/usr/bin/env bash
# Installs what Tessera needs on Debian 12 and builds it. Idempotent: when every
# package is present it goes straight to the (incremental) build.
#
#   bash tools/setup.sh              # build/ (RelWithDebInfo)
#   bash tools/setup.sh --sanitize   # build-asan/ (ASan + UBSan)
#   bash tools/setup.sh --tsan       # build-tsan/ (ThreadSanitizer)
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cmake_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
case "${1:-}" in
  --sanitize) build_dir=build-asan; cmake_flags=(-DCMAKE_BUILD_TYPE=Debug -DTESSERA_SANITIZE=ON) ;;
  --tsan) build_dir=build-tsan; cmake_flags=(-DCMAKE_BUILD_TYPE=Debug -DTESSERA_TSAN=ON) ;;
  "") ;;
  *) echo "usage: $0 [--sanitize|--tsan]" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config git curl jq
  libcpp-httplib-dev nlohmann-json3-dev libsqlite3-dev libzstd-dev libxxhash-dev libisal-dev
  libcli11-dev libgtest-dev libgmock-dev libssl-dev
  # The S3 checkpoint store: HTTP with libcurl (signing with OpenSSL, above).
  libcurl4-openssl-dev
  # The Python client (python/) and its tests run in .venv/ (below), made from Debian's
  # python3; the scripts outside it use Debian's numpy.
  python3 python3-venv python3-numpy
  # The multihost tests: hosts as network namespaces (ip) with their own mounts (unshare,
  # nsenter), sharing the checkpoint root over sshfs from one host's sshd.
  iproute2 util-linux sshfs openssh-server
  # The s3 tests: a single-node Ceph with its S3 gateway (tools/s3/rgw.sh), and boto3
  # for the S3 benchmark's peer.
  ceph-mon ceph-osd radosgw ceph-common python3-boto3
  # promtool (Prometheus' linter) checks tesserad's /metrics in the REST tests.
  prometheus
  # The fuzz tier (fuzz/, build-clang/): clang, and libFuzzer with the sanitizer
  # runtimes (only recommended by clang, so named here).
  clang libclang-rt-14-dev
  # The openssl command makes the self-signed certificates of the TLS tests.
  openssl
  # The HA tests: leadership through etcd (tools/etcd/, on ports of their own).
  etcd-server etcd-client
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The browser tests (tests/browser): Node.js with npm, and Debian's chromium. Checked by
# command, not package: a Node.js from elsewhere (with its own npm) will do.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# playwright-core, as pinned in package-lock.json; again only when the lock changed.
if [ ! tests/browser/node_modules/.package-lock.json -nt tests/browser/package-lock.json ]; then
  echo "setup: npm ci in tests/browser"
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# The Python environment (.venv/) from python/requirements.txt, when that file changed.
bash tools/venv.sh

echo "setup: building into $build_dir/"
cmake -S . -B "$build_dir" -G Ninja "${cmake_flags[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
