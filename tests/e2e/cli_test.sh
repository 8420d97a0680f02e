#!/usr/bin/env bash
# The tessera CLI as a user runs it: demo (a real local cluster), inspect (table and JSON), verify, ls,
# then verify and inspect of damaged checkpoints (exit codes and named culprits).
set -euo pipefail
bin=$1
root=$(mktemp -d /tmp/tessera-cli-XXXXXX)
trap 'rm -rf "$root"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$bin" demo --dir "$root" --keep)
echo "$out" | grep -q "^demo OK" || fail "demo failed: $out"
echo "$out" | grep -q "every shard equals the saved values" || fail "demo restore: $out"
echo "$out" | grep -q "same global tensors" || fail "demo reshard: $out"
ckpt="$root/data/checkpoints/demo/step-100"
[ -f "$ckpt/index.sqlite" ] || fail "no index in $ckpt"
ls -a "$root/data/checkpoints/demo" | grep -q staging && fail "staging dir left behind"
pgrep -f "data-dir $root/data" && fail "demo left processes running"

"$bin" inspect "$ckpt" | grep -q "dense/kernel .*bfloat16" || fail "inspect table lacks dense/kernel"
"$bin" inspect --json "$ckpt" | grep -q '"name": "optimizer/step"' || fail "inspect --json"
"$bin" verify "$ckpt" | grep -q "^OK" || fail "verify of a good checkpoint"

# ls: the root's meshes and committed steps with their sizes, from the root alone.
out=$("$bin" ls "$root/data/checkpoints")
echo "$out" | grep -Eq "^demo +100 +10 " || fail "ls lacks demo step 100 with 10 tensors: $out"
"$bin" ls --json "$root/data/checkpoints" | grep -q '"step": 100' || fail "ls --json"
set +e
err=$("$bin" ls "$root/nowhere" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && echo "$err" | grep -q "not_found.*$root/nowhere" || fail "ls of a missing root: $rc $err"

# Flip one byte in the middle of rank 0's shard (shard-0-<tag>.tsr): verify exits 2
# naming file and tensor.
shard0=$(cd "$ckpt" && ls shard-0-*.tsr | head -n1)
[ -n "$shard0" ] || fail "no shard file of rank 0 in $ckpt"
size=$(stat -c %s "$ckpt/$shard0")
printf '\xAA' | dd of="$ckpt/$shard0" bs=1 seek=$((size / 2)) conv=notrunc status=none
set +e
out=$("$bin" verify "$ckpt"); rc=$?
set -e
[ "$rc" -eq 2 ] || fail "verify exit $rc after corruption, want 2"
echo "$out" | grep -q "BAD .*tensor .* file $shard0" || fail "verify does not name the culprit: $out"
out=$("$bin" verify --json "$ckpt" || true)
echo "$out" | grep -q "\"ok\": false" || fail "verify --json ok flag: $out"

# One bit flipped in the index: its checksum no longer matches, verify and inspect
# say data_loss naming index.sqlite (exit 1).
off=$(( $(stat -c %s "$ckpt/index.sqlite") / 2 ))
byte=$(od -An -tu1 -j "$off" -N1 "$ckpt/index.sqlite" | tr -d ' ')
printf "$(printf '\\%03o' $(( byte ^ 4 )))" | dd of="$ckpt/index.sqlite" bs=1 seek="$off" conv=notrunc status=none
for cmd in verify inspect; do
  set +e
  err=$("$bin" "$cmd" "$ckpt" 2>&1); rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "$cmd exit $rc after a bit flip in the index, want 1: $err"
  echo "$err" | grep -q "data_loss.*index.sqlite.*checksum" || fail "$cmd after a bit flip: $err"
done

# Garbage index: a clear data_loss error, exit 1.
head -c 8192 /dev/urandom > "$ckpt/index.sqlite"
set +e
err=$("$bin" inspect "$ckpt" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] || fail "inspect exit $rc on garbage index"
echo "$err" | grep -q "data_loss" || fail "inspect error not data_loss: $err"

# Missing index: not_found naming the file.
rm "$ckpt/index.sqlite"
set +e
err=$("$bin" verify "$ckpt" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && echo "$err" | grep -q "not_found.*index.sqlite" || fail "missing index: $err"
echo "cli_test: ok"
