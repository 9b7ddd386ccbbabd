#!/usr/bin/env bash
# Runs every libFuzzer target of test/fuzz for a bounded time and ends with
# one line "N passed, N failed" (one case per target). A target passes when
# it ran its time out without a crash, a sanitizer report, a leak or a
# timeout; otherwise the case fails and the reproducer's path is printed.
#
#   FUZZ_SECONDS=N   seconds per target (default 60)
#   FUZZ_ONLY=REGEX  only the targets whose name matches
#   FUZZ_BUILD=DIR   where the binaries are (default build-fuzz)
#
# Seeds come from test/fuzz/corpus/NAME (read only); what a run discovers
# is kept in $FUZZ_BUILD/corpus/NAME for the next run on this machine, and
# findings go to $FUZZ_BUILD/artifacts/NAME/. The binaries are built first
# (make fuzz-build); a build failure fails every case.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

seconds=${FUZZ_SECONDS:-60}
build=${FUZZ_BUILD:-build-fuzz}
only=${FUZZ_ONLY:-}

targets=()
for src in test/fuzz/*_fuzz.cpp; do
  name=$(basename "$src" _fuzz.cpp)
  if [ -n "$only" ] && ! [[ $name =~ $only ]]; then continue; fi
  targets+=("$name")
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz target matches '${only}'"
  echo "0 passed, 1 failed"
  exit 1
fi

if ! make -s fuzz-build FUZZ_BUILD="$build" >"$build.make.log" 2>&1; then
  cat "$build.make.log"
  echo "!!! fuzz targets do not build (see above)"
  echo "0 passed, ${#targets[@]} failed"
  exit 1
fi
rm -f "$build.make.log"

# Symbolized sanitizer reports that stop at the first error.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && [ -x /usr/lib/llvm-14/bin/llvm-symbolizer ]; then
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
fi

passed=0
failed=0
summary=()
for name in "${targets[@]}"; do
  bin=$build/${name}_fuzz
  seeds=test/fuzz/corpus/$name
  work=$build/corpus/$name
  artifacts=$build/artifacts/$name/
  log=$build/logs/$name.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096
        -print_final_stats=1 -artifact_prefix="$artifacts")
  [ -f "test/fuzz/$name.dict" ] && args+=(-dict="test/fuzz/$name.dict")
  dirs=("$work")
  [ -d "$seeds" ] && dirs+=("$seeds")

  echo "--- $name: ${seconds}s"
  before=$(ls "$artifacts")
  "$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  corpus=$(find "$work" -type f | wc -l)
  if [ "$rc" = 0 ] && ! grep -qE '^==[0-9]+==ERROR|runtime error:|FUZZ_CHECK failed' "$log"; then
    line="PASS $name: ${execs:-?} execs, ${rate:-?}/s, ${corpus} inputs in $work"
    passed=$((passed + 1))
  else
    new=$(comm -13 <(echo "$before") <(ls "$artifacts") | head -1)
    grep -E 'ERROR|runtime error:|FUZZ_CHECK failed|SUMMARY|deadly signal' "$log" | head -5
    if [ -n "$new" ]; then
      line="FAIL $name (rc=$rc): reproducer $artifacts$new (rerun: $bin $artifacts$new); log $log"
    else
      line="FAIL $name (rc=$rc): no reproducer saved; log $log"
    fi
    failed=$((failed + 1))
  fi
  echo "$line"
  summary+=("$line")
done

echo
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
