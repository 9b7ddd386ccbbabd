#!/usr/bin/env bash
# smoke.sh - proves the two-host RDMA harness (test/rdma/vm.sh) end to end.
#
# usage: test/rdma/smoke.sh        (from anywhere; runs in the repository root)
#
# Builds test/rdma/smoke.cpp into $BUILD/rdma (default build/rdma), then in
# two guests: host B opens an rdma_cm RC connection to host A and does an RDMA
# WRITE_WITH_IMM of 16 KiB into A's buffer, A checks data + immediate and SENDs
# back a checksum; then a kernel TCP transfer B -> A (256 KiB) is checked the
# same way. Exit status is vm.sh's: 0 pass, 77 skipped (no usable QEMU), 124
# timeout, 125 setup error, else the failing program's status. Knobs: vm.sh's
# RSOCK_VM_* (e.g. RSOCK_VM_TIMEOUT, RSOCK_VM_ACCEL), BUILD.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT" # vm.sh shares the current directory read-write with the guests
OUT=${BUILD:-build}/rdma

# The build needs the verbs/rdma_cm headers; fresh machines may lack them.
need=()
for p in g++ libibverbs-dev librdmacm-dev; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2> /dev/null | grep -q '^ii' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "smoke: installing ${need[*]}" >&2
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends)
  "${apt[@]}" "${need[@]}" >&2 || { apt-get update >&2 && "${apt[@]}" "${need[@]}" >&2; } ||
    { echo "smoke: SKIPPED: cannot install ${need[*]}" >&2; exit 77; }
fi

mkdir -p "$OUT"
# Rebuild only when the source changed (the guests run the same binary).
if [ ! -x "$OUT/smoke" ] || [ "$HERE/smoke.cpp" -nt "$OUT/smoke" ]; then
  g++ -std=c++20 -O2 -g -Wall -Wextra -o "$OUT/smoke" "$HERE/smoke.cpp" -libverbs -lrdmacm
fi

# Ports are fixed: each guest is a fresh machine, nothing else listens there.
RDMA_PORT=7471
TCP_PORT=7472
SMOKE=$OUT/smoke

# Host A: start both servers, tell B once they really listen (polling, not a
# sleep), then require both to succeed.
# shellcheck disable=SC2016 # expanded inside the guests
CMD_A='
  "$SMOKE" rdma-server '$RDMA_PORT' & rdma=$!
  "$SMOKE" tcp-server '$TCP_PORT' & tcp=$!
  rsock_wait_listen '$RDMA_PORT' 60 && rsock_wait_listen '$TCP_PORT' 60 && rsock_signal servers-up
  wait $rdma; r1=$?
  wait $tcp; r2=$?
  [ $r1 = 0 ] && [ $r2 = 0 ]'
# Host B: the clients, one after the other.
# shellcheck disable=SC2016
CMD_B='
  rsock_wait servers-up 120 &&
  "$SMOKE" rdma-client "$RSOCK_VM_PEER_IP" '$RDMA_PORT' &&
  "$SMOKE" tcp-client "$RSOCK_VM_PEER_IP" '$TCP_PORT

export SMOKE
set +e
"$HERE/vm.sh" "$CMD_A" "$CMD_B"
rc=$?
set -e
case $rc in
  0) echo "smoke: PASS (rdma_cm RC + RDMA WRITE_WITH_IMM + kernel TCP across two guests)" ;;
  77) echo "smoke: SKIPPED (see the reason above)" ;;
  124) echo "smoke: FAIL (timeout)" ;;
  125) echo "smoke: FAIL (harness setup error)" ;;
  *) echo "smoke: FAIL (status $rc)" ;;
esac
exit "$rc"
