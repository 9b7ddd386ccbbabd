#!/usr/bin/env bash
# Runs every test tier and ends with one summary line the CI reads:
# "N passed, N failed". A tier that crashes or prints no summary counts as a
# failure, so a run that executes no test can never pass.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
skipped=0
log_dir=build/test-logs
mkdir -p "$log_dir"

# gtest_tier NAME BINARY: runs a GoogleTest binary and adds its counts.
gtest_tier() {
  local name=$1 bin=$2 log=$log_dir/$1.log
  echo "=== $name ==="
  "$bin" --gtest_color=no 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local p f
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
  if [ -z "$p" ] && [ -z "$f" ]; then
    echo "!!! $name: no GoogleTest summary (rc=$rc): counted as one failure"
    failed=$((failed + 1))
    return
  fi
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0}))
  if [ "$rc" != 0 ] && [ -z "$f" ]; then failed=$((failed + 1)); fi
}

# script_tier NAME SCRIPT: runs a script whose last line is "N passed, N failed".
script_tier() {
  local name=$1 script=$2 log=$log_dir/$1.log
  echo "=== $name ==="
  bash "$script" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  if [ -z "$line" ]; then
    echo "!!! $name: no summary line (rc=$rc): counted as one failure"
    failed=$((failed + 1))
    return
  fi
  local p f s
  p=$(echo "$line" | sed 's/^\([0-9]*\) passed.*/\1/')
  f=$(echo "$line" | sed 's/.* \([0-9]*\) failed.*/\1/')
  s=$(echo "$line" | sed -n 's/.* \([0-9]*\) skipped.*/\1/p')
  passed=$((passed + p))
  failed=$((failed + f))
  skipped=$((skipped + ${s:-0}))
  # 77 = the tier could not run here and said so (its cases count as skipped).
  if [ "$rc" != 0 ] && [ "$rc" != 77 ] && [ "$f" = 0 ]; then failed=$((failed + 1)); fi
}

gtest_tier unit build/unit_tests
gtest_tier preload build/preload_tests
# Every libFuzzer target briefly, one case each (test/fuzz/README.md).
FUZZ_SECONDS=${FUZZ_TEST_SECONDS:-15} script_tier fuzz test/fuzz/run.sh
[ -f test/apps/run.sh ] && script_tier apps test/apps/run.sh
[ -f test/rdma/run.sh ] && script_tier rdma test/rdma/run.sh
[ -f test/rdma/verbs.sh ] && script_tier rdma-channel test/rdma/verbs.sh

echo
if [ "$skipped" != 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" = 0 ]
