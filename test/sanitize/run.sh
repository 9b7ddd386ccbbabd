#!/usr/bin/env bash
# Runs one tier of a sanitizer build under that sanitizer's options:
#
#   test/sanitize/run.sh asan|ubsan|tsan unit|preload [GoogleTest arguments]
#
# e.g. test/sanitize/run.sh tsan preload --gtest_filter='*nb_*' --gtest_repeat=20
# Build first: make tsan-build (or make tsan, which builds and runs both
# tiers through test/run_all.sh).
#
# The test binary is BUILD/unit_tests or BUILD/preload_tests of build-asan/,
# build-ubsan/ or build-tsan/. The preload tests spawn that folder's
# instrumented programs with its instrumented librsock.so (harness.h finds
# the folder from the binary's own path), pass these options on with a
# log_path of their own, and fail a test for any report a spawned process
# wrote. A report in the test binary itself makes it exit with status 66
# (ASan, TSan) or stop at once (UBSan), which test/run_all.sh counts as a
# failure even when every test passed.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() {
  echo "usage: $0 asan|ubsan|tsan unit|preload [GoogleTest arguments]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
san=$1
tier=$2
shift 2
case $san in asan | ubsan | tsan) ;; *) usage ;; esac
case $tier in
  unit) bin=unit_tests ;;
  preload) bin=preload_tests ;;
  *) usage ;;
esac
build=build-$san
if [ ! -x "$build/$bin" ]; then
  echo "$build/$bin is not built: run make $san-build" >&2
  exit 2
fi

# Common to all three: exit status 66 for a report, so that it cannot pass
# for a test's own failure status.
export ASAN_OPTIONS="exitcode=66:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
# halt_on_error=0: one run shows every race, not just the first; the exit
# status still says there was one.
export TSAN_OPTIONS="exitcode=66:halt_on_error=0:second_deadlock_stack=1:history_size=4"
export UBSAN_OPTIONS="exitcode=66:halt_on_error=1:print_stacktrace=1"
# A suppressions file, where one exists, says for each entry why it cannot
# be fixed here (never one of librsock's own reports).
for kind in asan:ASAN lsan:LSAN tsan:TSAN ubsan:UBSAN; do
  file=$PWD/test/sanitize/${kind%%:*}.supp
  var=${kind##*:}_OPTIONS
  [ -f "$file" ] && export "$var=${!var:-}${!var:+:}suppressions=$file"
done
exec "$build/$bin" "$@"
