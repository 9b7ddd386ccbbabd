#!/usr/bin/env bash
# verbs.sh - the verbs transport between two emulated hosts (test/rdma/vm.sh).
#
# usage: test/rdma/verbs.sh        (from anywhere; runs in the repository root)
#
# Builds build/librsock.a (make) and test/rdma/verbs_pair_test.cpp into
# $BUILD/rdma/verbs_pair_test, then runs it in two guests: host A serves,
# host B connects. Cases (see verbs_pair_test.cpp): nolistener (B against a
# TCP-only server: pairing returns peer_not_accelerated), xfer (8 MiB both
# ways at once, checked, EOF), many (40 connections sharing one engine,
# closed while the peer still reads), rings (connections
# in a row reuse registered rings; the pinned-memory bound), rkeys (one connection's rkey refused
# on another's queue pair), linger (a close returns while its queue pair
# waits in the engine for a verdict that takes seconds), pingpong and bw over the verbs stream and over
# kernel TCP (numbers printed, not asserted), kill (A dies mid-stream, B must
# see an error or EOF), the move protocol (move-early, move-late, move-both,
# move-twice, move-kill) and bytes behind librsock on an end that moved or is
# moving (move-raw, move-raw-detached: both ends reset). The last line is "N passed, N failed" (plus "N skipped"
# when the guests cannot run: vm.sh exit 77, printed loudly, never a pass).
# Exit status: 0 all passed, 77 skipped, else 1. Knobs: vm.sh's RSOCK_VM_*,
# BUILD, RSOCK_RING_SIZE, RSOCK_CONNECT_TIMEOUT_MS (default 5000 here),
# RSOCK_LOG_LEVEL (a digit; default 3, debug).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT" # vm.sh shares the current directory read-write with the guests
BUILD=${BUILD:-build}
OUT=$BUILD/rdma
# One line: the list goes into the guests' command lines as it is.
CASES_RDMA="xfer rings many rkeys linger pingpong bw tcp-pingpong tcp-bw move-early move-late move-both move-twice move-kill move-raw move-raw-detached kill"
NCASES=18 # the above plus nolistener

need=()
for p in g++ libibverbs-dev librdmacm-dev; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2> /dev/null | grep -q '^ii' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "verbs: installing ${need[*]}" >&2
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends)
  "${apt[@]}" "${need[@]}" >&2 || { apt-get update >&2 && "${apt[@]}" "${need[@]}" >&2; } || {
    echo "verbs: SKIPPED: cannot install ${need[*]}" >&2
    echo "0 passed, 0 failed, $NCASES skipped"
    exit 77
  }
fi

make -s BUILD="$BUILD" "$BUILD/librsock.a"
mkdir -p "$OUT"
g++ -std=c++20 -O2 -g -Wall -Wextra -Isrc -Iinclude -o "$OUT/verbs_pair_test" \
  "$HERE/verbs_pair_test.cpp" "$BUILD/librsock.a" -libverbs -lrdmacm -ldl -pthread

export VPT=$OUT/verbs_pair_test
# The moves' log lines (a few per case) are what tells a stuck case apart;
# a failing case also prints its end's state (VerbsChannel::describe).
export RSOCK_LOG_LEVEL=${RSOCK_LOG_LEVEL:-3}
PORT=7480 PLAIN_PORT=7481 # each guest is a fresh machine: fixed ports are safe
# Host A: a TCP-only server for nolistener, then the verbs server. The kill
# case ends A's server with SIGKILL (status 137), which is the expected end.
# shellcheck disable=SC2016 # expanded inside the guests
CMD_A='
  "$VPT" plain-server '$PLAIN_PORT' & plain=$!
  "$VPT" server '$PORT' '"$CASES_RDMA"' & srv=$!
  rsock_wait_listen '$PLAIN_PORT' 60 && rsock_wait_listen '$PORT' 60 && rsock_signal up
  wait $plain; r1=$?
  wait $srv; r2=$?
  echo "server exit statuses: plain $r1, verbs $r2 (137 = killed by the kill case: expected)"
  [ $r1 = 0 ] && [ $r2 = 137 ]'
# shellcheck disable=SC2016
CMD_B='
  rsock_wait up 120 &&
  { "$VPT" client "$RSOCK_VM_PEER_IP" '$PLAIN_PORT' nolistener; r1=$?;
    "$VPT" client "$RSOCK_VM_PEER_IP" '$PORT' '"$CASES_RDMA"'; r2=$?;
    [ $r1 = 0 ] && [ $r2 = 0 ]; }'

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
"$HERE/vm.sh" "$CMD_A" "$CMD_B" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 77 ]; then
  echo "verbs: ################################################################"
  echo "verbs: SKIPPED: the RDMA guests cannot run on this machine (reason above)"
  echo "verbs: ################################################################"
  echo "0 passed, 0 failed, $NCASES skipped"
  exit 77
fi
passed=$(grep -c '^\[B\] client: PASS ' "$log" || true)
failed=$(grep -cE '^\[[AB]\] [a-z-]+: FAIL ' "$log" || true)
# A case that never reported (a crash, a hang cut by the timeout) is a failure.
missing=$((NCASES - passed - failed))
[ "$missing" -gt 0 ] && failed=$((failed + missing))
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
  echo "verbs: vm.sh exited with status $rc"
  failed=1
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
