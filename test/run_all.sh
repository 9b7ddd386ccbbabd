#!/usr/bin/env bash
# Runs every test tier and ends with one summary line the CI reads:
# "N passed, N failed". A tier that crashes or prints no summary counts as a
# failure, so a run that executes no test can never pass.
#
# TIERS selects tiers (default: all): unit preload fuzz apps apps-eager
# (the apps tier with RSOCK_TCP_FIRST=0, test/apps/run.sh) rdma
# rdma-channel and the sanitizer tiers asan ubsan tsan. A sanitizer tier builds
# build-<name>/ (make <name>-build) and runs the unit and preload tiers
# there (test/sanitize/run.sh); `make asan` is TIERS=asan. Under a sanitizer
# only what is instrumented runs: the apps tier's binaries (sockperf, iperf)
# and the RDMA tiers' guests are not, so they run in the plain build only.
set -uo pipefail
cd "$(dirname "$0")/.."

TIERS=${TIERS:-all}
passed=0
failed=0
skipped=0
log_dir=build/test-logs
mkdir -p "$log_dir"
times=""

want() { [ "$TIERS" = all ] || [[ " $TIERS " == *" $1 "* ]]; }

# timed NAME CMD...: runs CMD, records how long NAME took, returns CMD's status.
timed() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  times+="${times:+, }$name $((SECONDS - start))s"
  return $rc
}

# gtest_tier NAME COMMAND...: runs a GoogleTest binary (or a command that
# execs one) and adds its counts.
gtest_tier() {
  local name=$1 log=$log_dir/$1.log
  shift
  echo "=== $name ==="
  "$@" --gtest_color=no 2>&1 | tee "$log"
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

# sanitizer_tier NAME: builds build-NAME/ and runs its unit and preload tiers.
sanitizer_tier() {
  local san=$1 log=$log_dir/$1-build.log
  echo "=== $san: build (build-$san/) ==="
  # A make of its own (the caller's make flags are not meant for it), with
  # as many jobs as there are cores.
  if ! timed "$san-build" env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS \
    make -j"$(nproc)" "$san-build" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "!!! $san: build failed (log: $log): counted as one failure"
    failed=$((failed + 1))
    return
  fi
  echo "($san: unit and preload tiers; apps and rdma run in the plain build only," \
    "their programs and guests are not instrumented)"
  timed "$san-unit" gtest_tier "$san-unit" bash test/sanitize/run.sh "$san" unit
  timed "$san-preload" gtest_tier "$san-preload" bash test/sanitize/run.sh "$san" preload
}

want unit && timed unit gtest_tier unit build/unit_tests
want preload && timed preload gtest_tier preload build/preload_tests
# Every libFuzzer target briefly, one case each (test/fuzz/README.md).
want fuzz && FUZZ_SECONDS=${FUZZ_TEST_SECONDS:-15} timed fuzz script_tier fuzz test/fuzz/run.sh
want apps && [ -f test/apps/run.sh ] && timed apps script_tier apps test/apps/run.sh
want apps-eager && [ -f test/apps/run.sh ] &&
  APPS_TCP_FIRST=0 timed apps-eager script_tier apps-eager test/apps/run.sh
want rdma && [ -f test/rdma/run.sh ] && timed rdma script_tier rdma test/rdma/run.sh
want rdma-channel && [ -f test/rdma/verbs.sh ] &&
  timed rdma-channel script_tier rdma-channel test/rdma/verbs.sh
for san in asan ubsan tsan; do
  want "$san" && sanitizer_tier "$san"
done

echo
echo "time per tier: $times"
if [ "$skipped" != 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
# A run that executed no test (a misspelt TIERS) proves nothing: it fails.
if [ "$passed" = 0 ] && [ "$failed" = 0 ]; then
  echo "no test ran (TIERS='$TIERS'; tiers are separated by spaces)" >&2
  exit 1
fi
[ "$failed" = 0 ]
