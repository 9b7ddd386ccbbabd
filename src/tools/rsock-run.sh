#!/usr/bin/env bash
# rsock-run: runs a program with librsock preloaded (README, "Quick start").
# Built into BUILD/rsock-run by the Makefile (which fills in the version),
# installed beside the library's directory (PREFIX/bin, PREFIX/lib).
set -euo pipefail

version="@VERSION@"
me=${0##*/}

usage() {
  cat <<EOF
usage: $me [options] [--] program [args...]

Runs program with librsock preloaded (LD_PRELOAD, kept if already set) and
the environment the options name; exits with the program's status.

options:
  --peers RULES      RSOCK_PEERS: the server side of the streams to accelerate,
                     comma-separated ADDR[/PREFIX]:PORT[-PORT] ("[IPv6]", "*" for
                     any port); set the same on both ends
  --conf FILE        RSOCK_CONF: a rule file (rules by role and program, knobs)
  --stats FILE       RSOCK_STATS: append one JSON line of statistics per process
  --log-level LEVEL  RSOCK_LOG_LEVEL: error, warn, info, debug or trace
  -v, --verbose      print what is set before running; log level info unless
                     --log-level says otherwise
  -h, --help         this text
  --version          the version

The environment variables librsock reads (set them as usual; default first):
  RSOCK_PEERS               (none)  rules, as --peers
  RSOCK_CONF                (none)  rule file, as --conf
  RSOCK_DISABLE             0       1: librsock does nothing
  RSOCK_STATS               (none)  statistics file, as --stats
  RSOCK_STATS_ALL           0       1: every process writes stats, also one
                                    that made no TCP socket
  RSOCK_PUBLISH             1       0: rsockstat does not show this process
  RSOCK_PUBLISH_DIR         /dev/shm  where processes publish for rsockstat
                                    (a private rsock-<uid> directory in it)
  RSOCK_LOG_LEVEL           warn    as --log-level
  RSOCK_LOG_FILE            stderr  log destination
  RSOCK_RING_SIZE           256K    bytes per ring and direction (4K..256M,
                                    a power of two)
  RSOCK_SPIN_US             50      how long a waiter spins before it sleeps
  RSOCK_CONNECT_TIMEOUT_MS  1000    bound on a pairing before falling back
                                    to TCP
  RSOCK_TCP_FIRST           1       same host: start on TCP and pair in the
                                    background; 0: pair inside connect/accept
  RSOCK_PAIR_DELAY_MS       5       with RSOCK_TCP_FIRST=1: when the pairing
                                    starts (0..60000)
  RSOCK_REGION_CACHE        16      shared-memory regions (and RDMA rings per
                                    device) kept for the next connections
                                    (0..4096)
  RSOCK_RDMA_PINNED         512M    memory the RDMA rings of a process may
                                    pin; beyond it connections stay on TCP
  RSOCK_REGION_FILE         pair    pair: one memfd per pair of processes;
                                    connection: one per connection

Details: README.md and docs/configuration.md.
EOF
}

die() {
  echo "$me: $*" >&2
  echo "Try '$me --help'." >&2
  exit 2
}

# The library: RSOCK_LIB, else beside this script (the build tree), else in
# the lib directory next to its bin directory (an installed tree).
find_lib() {
  if [[ -n "${RSOCK_LIB:-}" ]]; then
    [[ -f "$RSOCK_LIB" ]] || die "RSOCK_LIB=$RSOCK_LIB: no such file"
    echo "$RSOCK_LIB"
    return
  fi
  local here
  here=$(dirname "$(readlink -f "$0")")
  local c
  for c in "$here/librsock.so" "$here/../lib/librsock.so" "$here"/../lib/*/librsock.so; do
    if [[ -f "$c" ]]; then
      readlink -f "$c"
      return
    fi
  done
  die "cannot find librsock.so beside $here or in $here/../lib (set RSOCK_LIB)"
}

verbose=0
log_level=""
declare -a sets=()

while (($# > 0)); do
  case "$1" in
    --peers | --conf | --stats | --log-level)
      (($# >= 2)) || die "$1 needs a value"
      case "$1" in
        --peers) sets+=("RSOCK_PEERS=$2") ;;
        --conf)
          [[ -r "$2" && -f "$2" ]] || die "--conf $2: not a readable file"
          sets+=("RSOCK_CONF=$2")
          ;;
        --stats) sets+=("RSOCK_STATS=$2") ;;
        --log-level)
          case "$2" in
            error | warn | info | debug | trace | [0-4]) log_level=$2 ;;
            *) die "--log-level $2: expected error, warn, info, debug or trace" ;;
          esac
          ;;
      esac
      shift 2
      ;;
    --peers=* | --conf=* | --stats=* | --log-level=*)
      set -- "${1%%=*}" "${1#*=}" "${@:2}"
      ;;
    -v | --verbose)
      verbose=1
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    --version)
      echo "$me (librsock) $version"
      exit 0
      ;;
    --)
      shift
      break
      ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done

(($# > 0)) || die "no program to run"
if [[ -z "$log_level" && $verbose == 1 ]]; then log_level=info; fi
if [[ -n "$log_level" ]]; then sets+=("RSOCK_LOG_LEVEL=$log_level"); fi

if ! command -v -- "$1" > /dev/null; then
  echo "$me: $1: command not found" >&2
  exit 127
fi
lib=$(find_lib)
preload="$lib"
# Keep what is preloaded already (a sanitizer runtime must stay first).
if [[ -n "${LD_PRELOAD:-}" ]]; then
  case " ${LD_PRELOAD//:/ } " in
    *" $lib "*) preload=$LD_PRELOAD ;;
    *) preload="$LD_PRELOAD $lib" ;;
  esac
fi
sets+=("LD_PRELOAD=$preload")

if ((verbose)); then
  for s in "${sets[@]}"; do echo "$me: $s" >&2; done
  echo "$me: running $*" >&2
fi
for s in "${sets[@]}"; do export "${s?}"; done
exec "$@"
