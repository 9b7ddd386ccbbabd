#!/usr/bin/env bash
# Application tier: unmodified programs with librsock preloaded into BOTH the
# server and the client, over 127.0.0.1:
#   sockperf (ping-pong, throughput, under-load; select, poll, epoll),
#   iperf3 (one stream and -P 8, both directions), iperf (2);
#   nginx (two workers) serving static files to curl with sendfile on and
#   off, to wrk (keep-alive) and to ab (a new connection per request);
#   redis-server with redis-cli (values written and read back) and
#   redis-benchmark (-c 1, and -c 50 -P 16);
#   memcached -t 4 with memccp/memccat (files stored and read back),
#   memcslap (set, get) and memcaslap (every get verified);
#   a fork-per-connection echo server of our own (test/apps/forksrv.c: the
#   parent closes its copy at once, or after the child's first read; a child
#   that exits without closing; 2000 forks in a row) and an inetd-style
#   server (fork, dup2 onto 0/1, exec of a read/write echo);
#   Node.js http with a keep-alive agent (test/apps/node_http.js), a blocking
#   java.net echo (test/apps/EchoJava.java, `java File.java`), and a python3
#   socketserver.ThreadingTCPServer with 8 concurrent clients
#   (test/apps/py_threading.py), and one echoing whole 1 MiB messages
#   (py_threading.py echo-client; a known bug today: it hangs, 15 s).
# Each case checks the programs' own results (bodies and values compared
# with what was sent, request counts, the tools' error counts) AND the
# RSOCK_STATS lines of both ends: the connections each end made or accepted
# went over shm (the exact count where the program's model fixes it, and the
# two ends' totals equal), none over TCP, no fallback reason and no reset
# unless the case expects one, and bytes moved through the shim.
#
# Output: one line per case, "PASS name (N s)" or "FAIL name: why", then the
# last line "N passed, N failed"; exit status 1 if any case failed. A failed
# case prints the tails of its server and client output and of both ends'
# librsock logs (RSOCK_LOG_FILE per side), and its files are kept (path on
# stderr). A case whose failure is a known librsock bug says so after the
# reason ("[known: ...]"); it still runs, and its failure prints "KNOWN-BUG
# name: why" and counts as neither passed nor failed (APPS_STRICT=1 counts
# it as failed), so that CI stays a verdict on everything else. Pairing
# is bounded by RSOCK_CONNECT_TIMEOUT_MS=10000 (APPS_CONNECT_TIMEOUT_MS), not
# librsock's default of one second, except where a case says otherwise.
# Every process runs under timeout(1); servers run in a process group of
# their own (setsid), are found ready by polling `ss -ltn` and are stopped
# by that group (also from the EXIT trap), so no worker or forked child
# outlives its case. Runtime: 2-3.5 minutes on 2 loaded cores (the JVM case
# costs 10-20 s).
# Environment: BUILD (default build), APPS_SECONDS (per timed run, default
# 2), APPS_ONLY (a regex of case names to run), APPS_CONNECT_TIMEOUT_MS
# (default 10000), RSOCK_LOG_LEVEL etc. are
# passed through to the shim.
# APPS_TCP_FIRST=0 runs every case with RSOCK_TCP_FIRST=0 (eager pairing:
# a connection pairs inside connect() and accept()); by default (1, the
# library's default mode) a connection starts on kernel TCP and pairs
# RSOCK_PAIR_DELAY_MS later, so a short one never pairs. The stats checks
# then count a connection that its end
# counted as closed_before_pairing (on TCP) with the shm ones, and the bytes
# a paired connection carried before its switch (before_switch) with its
# others; a case that compares the stats' bytes with the program's skips
# that comparison on an end where a connection never paired (its bytes are
# in no counter). Everything the programs check themselves is unchanged.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/test/apps
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LIB=$BUILD/librsock.so
FORKSRV=$BUILD/apps/forksrv
T=${APPS_SECONDS:-2}
ONLY=${APPS_ONLY:-.}
WORK=$(mktemp -d /tmp/rsock-apps.XXXXXX)
SERVER_PID=""
PASSED=0
FAILED=0
KNOWN_SEEN=""
KEEP=0
# The Debian interpreters themselves (a version manager's shim on PATH would
# be a shell script, and the shim would run in the shell).
PYTHON=/usr/bin/python3
[[ -x $PYTHON ]] || PYTHON=$(command -v python3)
TCP_FIRST=${APPS_TCP_FIRST:-1}
[[ $TCP_FIRST == 0 || $TCP_FIRST == 1 ]] || { echo "APPS_TCP_FIRST must be 0 or 1" >&2; exit 2; }
export RSOCK_TCP_FIRST=$TCP_FIRST

# Cases that fail today because of a librsock bug (see the README's
# compatibility table); the note is printed after the reason when they fail.
declare -A KNOWN=()

cleanup() {
  stop_server_now
  ((KEEP)) || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ensure_tools() {
  local -a pkgs=()
  command -v sockperf >/dev/null || pkgs+=(sockperf)
  command -v iperf3 >/dev/null || pkgs+=(iperf3)
  command -v iperf >/dev/null || pkgs+=(iperf)
  command -v jq >/dev/null || pkgs+=(jq)
  command -v ss >/dev/null || pkgs+=(iproute2)
  command -v timeout >/dev/null || pkgs+=(coreutils)
  command -v setsid >/dev/null || pkgs+=(util-linux)
  command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || pkgs+=(nginx)
  command -v curl >/dev/null || pkgs+=(curl)
  command -v redis-server >/dev/null || pkgs+=(redis-server)
  command -v redis-cli >/dev/null || pkgs+=(redis-tools)
  command -v memcached >/dev/null || pkgs+=(memcached)
  command -v memccp >/dev/null || pkgs+=(libmemcached-tools)
  command -v wrk >/dev/null || pkgs+=(wrk)
  command -v ab >/dev/null || pkgs+=(apache2-utils)
  command -v node >/dev/null || pkgs+=(nodejs)
  command -v java >/dev/null || pkgs+=(default-jdk-headless)
  command -v cc >/dev/null || pkgs+=(gcc)
  [[ -x /usr/bin/python3 ]] || pkgs+=(python3)
  ((${#pkgs[@]} == 0)) && return 0
  local install="apt-get install -y --no-install-recommends ${pkgs[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "apps: missing Debian packages: ${pkgs[*]}; install them with:" >&2
    echo "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive $install" >&2
    echo "0 passed, 1 failed"
    exit 2
  fi
  echo "apps: installing ${pkgs[*]}" >&2
  # iperf3 asks whether to start a daemon; the answer is no.
  echo 'iperf3 iperf3/start_daemon boolean false' | debconf-set-selections 2>/dev/null
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive $install; } >&2; then
    echo "apps: apt-get install ${pkgs[*]} failed" >&2
    echo "0 passed, 1 failed"
    exit 2
  fi
}

# ---- helpers ---------------------------------------------------------------

# A free TCP port below the ephemeral range (no client socket can take it).
free_port() {
  local lo hi p i
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
  ((lo > 12000)) || lo=32768
  for ((i = 0; i < 200; i++)); do
    p=$((10000 + RANDOM % (lo - 10000)))
    [[ -z $(ss -tanH "( sport = :$p )" 2>/dev/null) ]] && {
      echo "$p"
      return 0
    }
  done
  return 1
}

# shim_env CASE SIDE PORT: the environment of a preloaded process of CASE on
# SIDE (srv|cli), as an `env` command line in SHIM_ENV. The pairing bound is
# PAIR_MS: generous by default, since on 2 cores shared with other work a
# server process can wait more than librsock's default second to be
# scheduled, and one such connection falls back (pair_timeout) and sends the
# rest of the case to TCP through the negative cache.
PAIR_MS=${APPS_CONNECT_TIMEOUT_MS:-10000}
shim_env() {
  SHIM_ENV=(env LD_PRELOAD="$LIB" RSOCK_PEERS="127.0.0.1:$3" RSOCK_STATS="$WORK/$1.$2.stats"
            RSOCK_LOG_FILE="$WORK/$1.$2.log" RSOCK_CONNECT_TIMEOUT_MS="$PAIR_MS")
}

# start_server CASE PORT CMD...: the shim on, stats to $WORK/CASE.srv.stats,
# in a process group of its own (SERVER_PID is its id: setsid does not fork
# here, since a script's background job is no group leader).
start_server() {
  local name=$1 port=$2 i
  shift 2
  shim_env "$name" srv "$port"
  setsid timeout --foreground -k 5 "${SERVER_LIMIT:-120}" "${SHIM_ENV[@]}" "$@" \
    >"$WORK/$name.srv.out" 2>&1 &
  SERVER_PID=$!
  for ((i = 0; i < 600; i++)); do
    [[ -n $(ss -ltnH "( sport = :$port )" 2>/dev/null) ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# run_client CASE PORT CMD...: returns the client's exit status; output is
# appended to $WORK/CASE.cli.out (CLIENT_OUT: another file).
run_client() {
  local name=$1 port=$2
  shift 2
  shim_env "$name" cli "$port"
  timeout --foreground -k 5 "${CLIENT_LIMIT:-$((T + 60))}" "${SHIM_ENV[@]}" "$@" \
    >>"${CLIENT_OUT:-$WORK/$name.cli.out}" 2>&1
}

# Waits (up to 5 s) until no connection to port is left on the server side.
wait_drained() {
  local port=$1 i
  for ((i = 0; i < 100; i++)); do
    [[ -z $(ss -tanH "( sport = :$port )" 2>/dev/null | grep -v -E 'LISTEN|TIME-WAIT') ]] && return 0
    sleep 0.05
  done
  return 1
}

alive() { kill -0 "$1" 2>/dev/null; }
group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# Waits up to $1 s for the server to exit on its own, then sends SIGNAL ($2,
# default INT: the tools print their totals and exit, which writes the stats
# line), then SIGTERM after 5 s (timeout(1) forwards both; it runs with
# --foreground everywhere: otherwise it also signals its whole process group,
# the tool gets each signal twice, and iperf (2) takes a second SIGINT as
# "_exit(0) now", which skips librsock's exit-time stats line). Last, what is
# left of the server's process group (workers, forked children) gets SIGTERM,
# then SIGKILL.
stop_server() {
  local grace=${1:-0} sig=${2:-INT} i
  [[ -n $SERVER_PID ]] || return 0
  for ((i = 0; i < grace * 20; i++)); do
    alive "$SERVER_PID" || break
    sleep 0.05
  done
  alive "$SERVER_PID" && kill "-$sig" "$SERVER_PID" 2>/dev/null
  for ((i = 0; i < 100; i++)); do
    alive "$SERVER_PID" || break
    sleep 0.05
  done
  alive "$SERVER_PID" && kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_RC=$?
  # Children still running after their parent ended (they end on their own
  # within a few seconds when all is well).
  for ((i = 0; i < 100; i++)); do
    group_alive "$SERVER_PID" || break
    sleep 0.05
  done
  if group_alive "$SERVER_PID"; then
    SERVER_LEFTOVERS=$(ps -o pid=,args= -g "$SERVER_PID" 2>/dev/null | head -n 5 | tr '\n' ';')
    kill -TERM -- "-$SERVER_PID" 2>/dev/null
    sleep 0.5
    kill -KILL -- "-$SERVER_PID" 2>/dev/null
  fi
  SERVER_PID=""
}

# From the EXIT trap: no grace.
stop_server_now() {
  [[ -n $SERVER_PID ]] || return 0
  kill -TERM -- "-$SERVER_PID" 2>/dev/null
  sleep 0.5
  kill -KILL -- "-$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
}

strip() { sed 's/\x1b\[[0-9;]*m//g' "$1" 2>/dev/null; }

# stat_of FILE PROGRAM FIELD: FIELD summed over PROGRAM's stats lines ("" if none).
stat_of() {
  [[ -s $1 ]] || return 0
  jq -s -r --arg p "$2" "[.[] | select(.program == \$p)] | if length == 0 then \"\" else (map($3) | add) end" \
    "$1" 2>/dev/null
}

# lines_of FILE PROGRAM: how many stats lines PROGRAM wrote.
lines_of() {
  [[ -s $1 ]] || {
    echo 0
    return
  }
  jq -s --arg p "$2" '[.[] | select(.program == $p)] | length' "$1" 2>/dev/null
}

# reasons_of FILE PROGRAM KEY: the KEY (fallbacks, resets, rejected) counts
# of PROGRAM's lines added up, non-zero ones only, as sorted compact JSON.
reasons_of() {
  [[ -s $1 ]] || {
    echo '{}'
    return
  }
  jq -s -S -c --arg p "$2" "[.[] | select(.program == \$p) | .$3 // {} | to_entries[]] |
    group_by(.key) | map({key: .[0].key, value: (map(.value) | add)}) |
    map(select(.value != 0)) | from_entries" "$1" 2>/dev/null
}

# bytes_of FILE PROGRAM sent|received: the bytes PROGRAM's connections
# moved through librsock (APPS_TCP_FIRST: with what they carried on TCP
# before their switch).
bytes_of() {
  local v b
  v=$(stat_of "$1" "$2" ".bytes_$3")
  if [[ $TCP_FIRST == 1 && -n $v ]]; then
    b=$(stat_of "$1" "$2" ".before_switch.$3")
    v=$((v + ${b:-0}))
  fi
  echo "$v"
}

# early_of FILE PROGRAM: PROGRAM's connections that ended before their
# pairing (APPS_TCP_FIRST; 0 otherwise: there a count would be a failure,
# which the fallback checks report).
early_of() {
  local v=0
  [[ $TCP_FIRST == 1 ]] && v=$(stat_of "$1" "$2" '(.fallbacks.closed_before_pairing // 0)')
  echo "${v:-0}"
}

# check_stats CASE PROGRAM: both ends paired over shm, none on plain TCP, and
# each end moved bytes. Sets STATS_WHY on failure; exports S_*/C_* values.
check_stats() {
  local name=$1 prog=$2 side f
  STATS_WHY="" S_SENT=0 S_RECV=0 C_SENT=0 C_RECV=0
  for side in srv cli; do
    f=$WORK/$name.$side.stats
    local shm tcp sent recv early
    shm=$(stat_of "$f" "$prog" .connections.shm)
    tcp=$(stat_of "$f" "$prog" .connections.tcp)
    sent=$(bytes_of "$f" "$prog" sent)
    recv=$(bytes_of "$f" "$prog" received)
    if [[ -z $shm ]]; then
      STATS_WHY+="no $prog stats line from the $side; "
      continue
    fi
    early=$(early_of "$f" "$prog")
    tcp=$((tcp - early))
    ((shm >= 1)) || STATS_WHY+="$side connections.shm=$shm; "
    ((tcp == 0)) || STATS_WHY+="$side connections.tcp=$tcp (fallbacks: $(jq -c -s 'map(.fallbacks)' "$f")); "
    ((sent + recv > 0)) || STATS_WHY+="$side moved no bytes; "
    if [[ $side == srv ]]; then S_SENT=$sent S_RECV=$recv; else C_SENT=$sent C_RECV=$recv; fi
  done
  [[ -z $STATS_WHY ]]
}

# expect_end CASE SIDE PROGRAM SHM [FALLBACKS [TCP]]: PROGRAM's stats lines on
# SIDE (srv|cli) add up to SHM shm connections (a number, or ">=N"), TCP
# plain ones (default 0) and none over rdma, with exactly the FALLBACKS
# reasons (JSON, default {}) and no reset. Appends to WHY; sets E_SHM,
# E_SENT, E_RECV (the sums) and E_EARLY (APPS_TCP_FIRST: the connections
# that ended before their pairing, counted with the shm ones in E_SHM).
expect_end() {
  local name=$1 side=$2 prog=$3 want_shm=$4 want_fb=${5:-'{}'} want_tcp=${6:-0}
  local f=$WORK/$name.$side.stats n v
  E_SHM=0 E_SENT=0 E_RECV=0 E_EARLY=0
  n=$(lines_of "$f" "$prog")
  if [[ ${n:-0} == 0 ]]; then
    WHY+="$side: no stats line of $prog; "
    return
  fi
  E_EARLY=$(early_of "$f" "$prog")
  E_SHM=$(($(stat_of "$f" "$prog" .connections.shm) + E_EARLY))
  E_SENT=$(bytes_of "$f" "$prog" sent)
  E_RECV=$(bytes_of "$f" "$prog" received)
  if [[ $want_shm == ">="* ]]; then
    ((E_SHM >= ${want_shm#>=})) || WHY+="$side $prog: connections.shm=$E_SHM, want $want_shm; "
  else
    [[ $E_SHM == "$want_shm" ]] || WHY+="$side $prog: connections.shm=$E_SHM, want $want_shm; "
  fi
  v=$(stat_of "$f" "$prog" .connections.tcp)
  [[ $((v - E_EARLY)) == "$want_tcp" ]] ||
    WHY+="$side $prog: connections.tcp=$v (of them $E_EARLY ended before pairing), want $want_tcp; "
  v=$(stat_of "$f" "$prog" .connections.rdma)
  [[ $v == 0 ]] || WHY+="$side $prog: connections.rdma=$v; "
  v=$(reasons_of "$f" "$prog" fallbacks)
  [[ $TCP_FIRST == 1 ]] && v=$(jq -S -c 'del(.closed_before_pairing)' <<<"$v")
  [[ $v == "$(jq -S -c . <<<"$want_fb")" ]] || WHY+="$side $prog: fallbacks $v, want $want_fb; "
  v=$(reasons_of "$f" "$prog" resets)
  [[ $v == '{}' ]] || WHY+="$side $prog: resets $v; "
}

CASE_T0=0
report() {
  local name=$1 why=$2 f
  if [[ -z $why ]]; then
    echo "PASS $name ($((SECONDS - CASE_T0)) s)"
    PASSED=$((PASSED + 1))
  else
    if [[ -n ${KNOWN[$name]:-} && ${APPS_STRICT:-0} != 1 ]]; then
      echo "KNOWN-BUG $name: $why [known: ${KNOWN[$name]}]"
      KNOWN_SEEN+=" $name"
    else
      echo "FAIL $name: $why${KNOWN[$name]:+ [known: ${KNOWN[$name]}]}"
      FAILED=$((FAILED + 1))
    fi
    KEEP=1
    {
      for f in srv.out cli.out srv.log cli.log; do
        [[ -s $WORK/$name.$f ]] || continue
        echo "---- $name: $f (tail) ----"
        strip "$WORK/$name.$f" | tail -n 8
      done
    } >&2
  fi
}

want() {
  [[ $1 =~ $ONLY ]] || return 1
  CASE_T0=$SECONDS
  echo "apps: $1" >&2
}

# ---- sockperf ------------------------------------------------------------------

# sockperf_case NAME MODE IOMUX: MODE pp|tp|ul; the multiplexer (-F) is used by
# the server and the client through a one-line feed file.
sockperf_case() {
  local name=$1 mode=$2 iomux=$3 port why="" rc
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  echo "T:127.0.0.1:$port" >"$WORK/$name.feed"
  local -a addr=(-f "$WORK/$name.feed" -F "$iomux")
  if ! start_server "$name" "$port" sockperf server "${addr[@]}"; then
    stop_server
    report "$name" "server did not listen on port $port"
    return
  fi
  local -a client
  case $mode in
    # --mps only sizes sockperf's sample array (it aborts with
    # "_seqN > m_maxSequenceNo" past ~600K round trips/s otherwise).
    pp) client=(sockperf ping-pong "${addr[@]}" -m 64 --mps 2000000 -t "$T") ;;
    tp) client=(sockperf throughput "${addr[@]}" -m 1400 -t "$T") ;;
    ul) client=(sockperf under-load "${addr[@]}" -m 64 --mps 10000 -t "$T") ;;
  esac
  run_client "$name" "$port" "${client[@]}"
  rc=$?
  wait_drained "$port" || why+="server kept the connection open after the client left; "
  stop_server
  local srv_total sent
  srv_total=$(strip "$WORK/$name.srv.out" | sed -n 's/.*Total \([0-9]*\) messages received.*/\1/p' | tail -n 1)
  if ((rc != 0)); then
    why+="client exit status $rc; "
  elif [[ $mode == tp ]]; then
    sent=$(strip "$WORK/$name.cli.out" | sed -n 's/.*Total of \([0-9]*\) messages sent.*/\1/p')
    [[ -n $sent && $sent -gt 0 ]] || why+="client reports no messages sent; "
    [[ $srv_total == "$sent" ]] || why+="server received ${srv_total:-?} messages, client sent ${sent:-?}; "
  else
    local line received
    line=$(strip "$WORK/$name.cli.out" | grep -m1 'Total Run')
    sent=$(sed -n 's/.*SentMessages=\([0-9]*\).*/\1/p' <<<"$line")
    received=$(sed -n 's/.*ReceivedMessages=\([0-9]*\).*/\1/p' <<<"$line")
    [[ -n $received && $received -gt 0 ]] || why+="client received no replies; "
    strip "$WORK/$name.cli.out" | grep -q 'percentile 50.000' || why+="no latency percentiles; "
    [[ $srv_total == "$sent" ]] || why+="server received ${srv_total:-?} messages, client sent ${sent:-?}; "
  fi
  if check_stats "$name" sockperf; then
    # Every byte the client's shim sent was read by the server's shim.
    [[ $S_RECV == "$C_SENT" ]] || why+="stats: client bytes_sent=$C_SENT, server bytes_received=$S_RECV; "
    [[ $mode == tp ]] && [[ $S_RECV != $((srv_total * 1400)) ]] &&
      why+="stats: server bytes_received=$S_RECV != $srv_total x 1400; "
    [[ $mode != tp ]] && ((S_SENT == 0 || C_RECV == 0)) &&
      why+="stats: no reply bytes (server sent $S_SENT, client received $C_RECV); "
  else
    why+=$STATS_WHY
  fi
  report "$name" "${why%; }"
}

# ---- iperf3 ----------------------------------------------------------------------

# iperf3_case NAME REVERSE PARALLEL: -R when REVERSE, -P PARALLEL streams.
# iperf3 opens a control connection and one per stream: both ends count
# exactly PARALLEL + 1 shm connections.
iperf3_case() {
  local name=$1 reverse=$2 parallel=$3 port why="" rc
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! start_server "$name" "$port" iperf3 -s -1 -B 127.0.0.1 -p "$port" -J; then
    stop_server
    report "$name" "server did not listen on port $port"
    return
  fi
  local -a client=(iperf3 -c 127.0.0.1 -p "$port" -t "$T" -J -P "$parallel")
  ((reverse)) && client+=(-R)
  run_client "$name" "$port" "${client[@]}"
  rc=$?
  stop_server 5  # -1: the server exits after one test
  local out=$WORK/$name.cli.out err bytes streams
  err=$(jq -r '.error // empty' "$out" 2>/dev/null)
  bytes=$(jq -r '.end.sum_received.bytes // 0' "$out" 2>/dev/null)
  streams=$(jq -r '.end.streams | length' "$out" 2>/dev/null)
  ((rc == 0)) || why+="client exit status $rc; "
  [[ -z $err ]] || why+="iperf3 error: $err; "
  [[ -n $bytes && $bytes =~ ^[0-9]+$ && $bytes -gt 0 ]] || why+="JSON end.sum_received.bytes=${bytes:-?}; "
  [[ $streams == "$parallel" ]] || why+="JSON end.streams: ${streams:-?}, want $parallel; "
  if check_stats "$name" iperf3; then
    # The data streams' receiver read at least what iperf3 counted.
    if ((reverse)); then
      ((C_RECV >= bytes && S_SENT >= bytes)) ||
        why+="stats: server sent $S_SENT, client received $C_RECV < iperf3's $bytes; "
    else
      ((S_RECV >= bytes && C_SENT >= bytes)) ||
        why+="stats: client sent $C_SENT, server received $S_RECV < iperf3's $bytes; "
    fi
  else
    why+=$STATS_WHY
  fi
  WHY=""
  expect_end "$name" srv iperf3 $((parallel + 1))
  expect_end "$name" cli iperf3 $((parallel + 1))
  why+=$WHY
  report "$name" "${why%; }"
}

# ---- iperf (2) -------------------------------------------------------------------

iperf2_case() {
  local name=$1 reverse=$2 port why="" rc
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! start_server "$name" "$port" iperf -s -B 127.0.0.1 -p "$port" -y C; then
    stop_server
    report "$name" "server did not listen on port $port"
    return
  fi
  local -a client=(iperf -c 127.0.0.1 -p "$port" -t "$T" -y C)
  ((reverse)) && client+=(-R)
  run_client "$name" "$port" "${client[@]}"
  rc=$?
  wait_drained "$port" || why+="server kept the connection open after the client left; "
  stop_server
  # CSV: time,src,sport,dst,dport,id,interval,bytes,bits_per_second
  local bytes
  bytes=$(grep -E '^[0-9]+,' "$WORK/$name.cli.out" | tail -n 1 | cut -d, -f8)
  ((rc == 0)) || why+="client exit status $rc; "
  [[ -n $bytes && $bytes =~ ^[0-9]+$ && $bytes -gt 0 ]] || why+="CSV transferred bytes=${bytes:-?}; "
  if check_stats "$name" iperf; then
    if ((reverse)); then
      ((C_RECV >= bytes && S_SENT >= bytes)) ||
        why+="stats: server sent $S_SENT, client received $C_RECV < iperf's $bytes; "
    else
      ((S_RECV >= bytes && C_SENT >= bytes)) ||
        why+="stats: client sent $C_SENT, server received $S_RECV < iperf's $bytes; "
    fi
  else
    why+=$STATS_WHY
  fi
  report "$name" "${why%; }"
}

# ---- nginx -----------------------------------------------------------------------

# nginx_start CASE SENDFILE(on|off): nginx as Debian configures it (tcp_nopush
# on, sendfile as given) with two workers that share the listener, a private
# prefix, config and temp paths in $WORK (no system nginx service is
# involved), serving $WORK/CASE.nginx/www. Sets NGINX_PORT and NGINX_PREFIX;
# false (with the reason reported) when it did not start.
nginx_start() {
  local name=$1 sendfile=$2 port prefix nginx_bin
  nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
  port=$(free_port) || {
    report "$name" "no free port"
    return 1
  }
  prefix=$WORK/$name.nginx
  mkdir -p "$prefix/www" "$prefix/tmp" "$prefix/logs"
  # Workers run as this user (root in CI: otherwise nginx drops them to
  # nobody, who can read neither the files nor write the stats in $WORK).
  cat >"$prefix/nginx.conf" <<EOF
user $(id -un);
worker_processes 2;
daemon off;
master_process on;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  sendfile $sendfile;
  tcp_nopush on;
  keepalive_timeout 30;
  keepalive_requests 1000000;
  default_type application/octet-stream;
  client_body_temp_path $prefix/tmp/body;
  proxy_temp_path $prefix/tmp/proxy;
  fastcgi_temp_path $prefix/tmp/fastcgi;
  uwsgi_temp_path $prefix/tmp/uwsgi;
  scgi_temp_path $prefix/tmp/scgi;
  server {
    listen 127.0.0.1:$port;
    root $prefix/www;
  }
}
EOF
  NGINX_PORT=$port NGINX_PREFIX=$prefix
  if ! start_server "$name" "$port" "$nginx_bin" -p "$prefix" -c "$prefix/nginx.conf" \
    -e "$prefix/logs/error.log"; then
    stop_server
    report "$name" "nginx did not listen on port $port ($(tail -n 2 "$prefix/logs/error.log" 2>/dev/null))"
    return 1
  fi
}

# nginx_stop CASE CLIENT_PROGRAM CONNS: stops nginx (SIGQUIT: graceful; the
# workers finish and exit, which writes their stats lines) and checks both
# ends' stats: CLIENT_PROGRAM's lines add up to CONNS shm connections (a
# number or ">=N"), the workers' to as many as the client made; none on
# TCP, no fallback; three nginx lines (the master accepts nothing).
nginx_stop() {
  local name=$1 cprog=$2 conns=$3 n
  stop_server 0 QUIT
  expect_end "$name" cli "$cprog" "$conns"
  expect_end "$name" srv nginx "$E_SHM"
  n=$(lines_of "$WORK/$name.srv.stats" nginx)
  [[ $n == 3 ]] || WHY+="$n nginx stats lines, want 3 (master + 2 workers); "
}

# Static files to curl, with sendfile on (Debian's default: the bodies go out
# through sendfile(2), which must go through the ring, not into the kernel
# socket the client no longer reads) or off (read + writev). Sizes around
# the edges: a page, a ring (1 MiB), more than a ring, 10 MiB; one connection
# per file, then all files over one kept-alive connection; every body is
# compared with its file.
nginx_files_case() {
  local name=nginx-sendfile-$1 f size rc=0
  want "$name" || return 0
  nginx_start "$name" "$1" || return
  local prefix=$NGINX_PREFIX port=$NGINX_PORT
  local -a files=()
  for size in 1 4096 65537 1048576 3145735 10485760; do
    f=file_$size.bin
    head -c "$size" /dev/urandom >"$prefix/www/$f"
    files+=("$f")
  done
  for f in "${files[@]}"; do
    run_client "$name" "$port" curl -sS --max-time 30 -o "$WORK/$name.got.$f" \
      "http://127.0.0.1:$port/$f" || rc=$?
  done
  local -a keep=()
  for f in "${files[@]}"; do keep+=(-o "$WORK/$name.keep.$f" "http://127.0.0.1:$port/$f"); done
  run_client "$name" "$port" curl -sS --max-time 60 "${keep[@]}" || rc=$?
  WHY=""
  ((rc == 0)) || WHY+="curl exit status $rc; "
  local want got kept total=0
  for f in "${files[@]}"; do
    want=$(sha256sum <"$prefix/www/$f" | cut -d' ' -f1)
    got=$(cat "$WORK/$name.got.$f" 2>/dev/null | sha256sum | cut -d' ' -f1)
    kept=$(cat "$WORK/$name.keep.$f" 2>/dev/null | sha256sum | cut -d' ' -f1)
    [[ $got == "$want" ]] ||
      WHY+="$f: body differs ($(stat -c %s "$WORK/$name.got.$f" 2>/dev/null || echo 0) bytes); "
    [[ $kept == "$want" ]] || WHY+="$f (kept-alive): body differs; "
    total=$((total + 2 * $(stat -c %s "$prefix/www/$f")))
  done
  # Every curl on shm (one line each); the workers accepted as many, all on
  # shm, and sent at least the bodies (each file twice) through librsock.
  local conns=$((${#files[@]} + 1)) n sent
  nginx_stop "$name" curl "$conns"
  n=$(lines_of "$WORK/$name.cli.stats" curl)
  [[ $n == "$conns" ]] || WHY+="$conns curl stats lines expected, got $n; "
  sent=$(bytes_of "$WORK/$name.srv.stats" nginx sent)
  (($(early_of "$WORK/$name.srv.stats" nginx) > 0 || ${sent:-0} >= total)) ||
    WHY+="nginx bytes_sent=${sent:-0} < bodies $total; "
  report "$name" "${WHY%; }"
}

# wrk, keep-alive: 2 threads, 20 connections, APPS_SECONDS long, over nginx
# with sendfile off. A Lua script (wrk's own API) compares every response
# body with the file; wrk's summary must show no socket error and no
# non-2xx/3xx response, and every completed request verified. wrk opens one
# connection to check the address, then its 20: 21 on each end.
nginx_wrk_case() {
  local name=nginx-wrk rc
  want "$name" || return 0
  nginx_start "$name" off || return
  local prefix=$NGINX_PREFIX port=$NGINX_PORT
  head -c 4000 /dev/urandom | base64 -w 0 >"$prefix/www/page.txt"
  cat >"$WORK/$name.lua" <<'EOF'
-- Counts responses whose status is not 200 or whose body is not the file's.
good, bad = 0, 0
function init(args)
  local f = io.open(args[1], "rb")
  want = f:read("*a")
  f:close()
end
function response(status, headers, body)
  if status == 200 and body == want then good = good + 1 else bad = bad + 1 end
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local g, b = 0, 0
  for _, t in ipairs(threads) do g = g + t:get("good"); b = b + t:get("bad") end
  local e = summary.errors
  io.write(string.format("VERIFIED requests=%d good=%d bad=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, g, b, e.connect, e.read, e.write, e.status, e.timeout))
end
EOF
  run_client "$name" "$port" wrk -t 2 -c 20 -d "${T}s" -s "$WORK/$name.lua" \
    "http://127.0.0.1:$port/page.txt" -- "$prefix/www/page.txt"
  rc=$?
  WHY=""
  ((rc == 0)) || WHY+="wrk exit status $rc; "
  local v req good bad
  v=$(grep -m1 '^VERIFIED ' "$WORK/$name.cli.out")
  if [[ -z $v ]]; then
    WHY+="no VERIFIED line from wrk's script; "
  else
    req=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$v")
    good=$(sed -n 's/.* good=\([0-9]*\).*/\1/p' <<<"$v")
    bad=$(sed -n 's/.* bad=\([0-9]*\).*/\1/p' <<<"$v")
    ((${req:-0} > 0)) || WHY+="wrk completed no request; "
    [[ $good == "$req" && $bad == 0 ]] || WHY+="wrk: $good of $req responses verified, $bad wrong; "
    [[ $v == *" connect=0 read=0 write=0 status=0 timeout=0" ]] || WHY+="wrk errors: ${v#* bad=$bad }; "
  fi
  grep -q 'Non-2xx' "$WORK/$name.cli.out" && WHY+="wrk: $(grep -m1 'Non-2xx' "$WORK/$name.cli.out"); "
  nginx_stop "$name" wrk 21
  report "$name" "${WHY%; }"
}

# ab: a new connection per request, 2000 requests, 10 at a time, over nginx
# with sendfile on: ab's own checks (every request complete, none failed: a
# body of another length counts as failed; no non-2xx response), and the
# stats. ab opens up to 9 connections more than it has requests (for
# requests it then finds done; on plain TCP too) and closes them at once,
# while they pair: the client counts none of those (its connect never
# completed), nginx counts each as shm (it paired first) or as plain TCP
# with pair_failed, peer_not_accelerated or pair_timeout (the client was
# gone; which one depends on the step the close interrupted). So: ab
# 2000..2009 shm, no tcp, no fallback; nginx at least as many shm as ab,
# and all it accepted at most 2009, with no other reason.
nginx_ab_case() {
  local name=nginx-ab n=2000 rc
  want "$name" || return 0
  nginx_start "$name" on || return
  local prefix=$NGINX_PREFIX port=$NGINX_PORT
  head -c 20000 /dev/urandom >"$prefix/www/page.bin"
  run_client "$name" "$port" ab -q -n "$n" -c 10 "http://127.0.0.1:$port/page.bin"
  rc=$?
  WHY=""
  ((rc == 0)) || WHY+="ab exit status $rc; "
  local out=$WORK/$name.cli.out v
  v=$(sed -n 's/^Complete requests: *\([0-9]*\).*/\1/p' "$out")
  [[ $v == "$n" ]] || WHY+="ab: ${v:-?} of $n requests complete; "
  v=$(sed -n 's/^Failed requests: *\([0-9]*\).*/\1/p' "$out")
  [[ $v == 0 ]] || WHY+="ab: ${v:-?} failed requests; "
  v=$(sed -n 's/^Document Length: *\([0-9]*\).*/\1/p' "$out")
  [[ $v == 20000 ]] || WHY+="ab: document length ${v:-?}, want 20000; "
  grep -q '^Non-2xx' "$out" && WHY+="ab: $(grep -m1 '^Non-2xx' "$out"); "
  stop_server 0 QUIT
  expect_end "$name" cli ab ">=$n"
  local c_shm=$E_SHM s_shm s_tcp fb f=$WORK/$name.srv.stats
  ((c_shm <= n + 9)) || WHY+="ab made $c_shm shm connections for $n requests; "
  s_shm=$(stat_of "$f" nginx .connections.shm) s_tcp=$(stat_of "$f" nginx .connections.tcp)
  local early
  early=$(early_of "$f" nginx)
  s_shm=$((${s_shm:-0} + early)) s_tcp=$((${s_tcp:-0} - early))
  ((${s_shm:-0} >= c_shm)) || WHY+="nginx counted ${s_shm:-none} shm connections, ab $c_shm; "
  ((${s_shm:-0} + ${s_tcp:-0} <= n + 9)) || WHY+="nginx accepted $((s_shm + s_tcp)) connections for $n requests; "
  fb=$(reasons_of "$f" nginx fallbacks)
  [[ $TCP_FIRST == 1 ]] && fb=$(jq -S -c 'del(.closed_before_pairing)' <<<"$fb")
  [[ $(jq '[.pair_failed // 0, .peer_not_accelerated // 0, .pair_timeout // 0] | add' <<<"$fb") == "${s_tcp:-x}" &&
    $(jq 'del(.pair_failed, .peer_not_accelerated, .pair_timeout) | length' <<<"$fb") == 0 ]] ||
    WHY+="nginx: connections.tcp=${s_tcp:-none}, fallbacks $fb; "
  [[ $(reasons_of "$f" nginx resets) == '{}' ]] || WHY+="nginx resets $(reasons_of "$f" nginx resets); "
  [[ $(lines_of "$f" nginx) == 3 ]] || WHY+="$(lines_of "$f" nginx) nginx stats lines, want 3; "
  report "$name" "${WHY%; }"
}

# ---- redis -----------------------------------------------------------------------

# redis_start CASE: redis-server 7 (one event loop) on a free port, no
# persistence, its files in $WORK. Sets REDIS_PORT.
redis_start() {
  local name=$1 port
  port=$(free_port) || {
    report "$name" "no free port"
    return 1
  }
  mkdir -p "$WORK/$name.redis"
  REDIS_PORT=$port
  if ! start_server "$name" "$port" redis-server --port "$port" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$WORK/$name.redis" --logfile ''; then
    stop_server
    report "$name" "redis-server did not listen on port $port"
    return 1
  fi
}

# rcli CASE ARGS...: one redis-cli run (preloaded) against the case's server.
rcli() {
  local name=$1
  shift
  run_client "$name" "$REDIS_PORT" redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"
}

# commandstat CASE CMD: the server's call count of CMD (from INFO
# commandstats, asked with a preloaded redis-cli).
commandstat() {
  CLIENT_OUT=$WORK/$1.info rcli "$1" INFO commandstats
  tr -d '\r' <"$WORK/$1.info" | sed -n "s/^cmdstat_$2:calls=\([0-9]*\),.*/\1/p" | tail -n 1
}

# redis_stop CASE: SIGTERM (redis shuts down and exits, writing its stats
# line), then the server's connections must equal the clients' and all be
# on shm with no fallback. CLIENT_PROGS: "prog count" pairs expected on the
# client side.
redis_stop() {
  local name=$1 total=0 prog conns
  shift
  stop_server 0 TERM
  while (($#)); do
    prog=$1 conns=$2
    shift 2
    expect_end "$name" cli "$prog" "$conns"
    total=$((total + E_SHM))
  done
  expect_end "$name" srv redis-server "$total"
}

# Values written with redis-cli and read back: binary values of 1 B to
# 3 MiB (SET from stdin, GET --raw compared byte for byte), then 10000 keys
# through one `redis-cli --pipe` (mass insertion: the tool counts replies and
# errors), DBSIZE and 100 of them read back with MGET.
redis_cli_case() {
  local name=redis-cli size i rc=0
  want "$name" || return 0
  redis_start "$name" || return
  WHY=""
  local -a sizes=(1 100 4096 65537 1048576 3145728)
  for size in "${sizes[@]}"; do
    head -c "$size" /dev/urandom >"$WORK/$name.val.$size"
    CLIENT_OUT=$WORK/$name.set.$size rcli "$name" -x SET "key:$size" <"$WORK/$name.val.$size" || rc=$?
    [[ $(tr -d '\r\n' <"$WORK/$name.set.$size") == OK ]] ||
      WHY+="SET of $size bytes: $(head -c 100 "$WORK/$name.set.$size"); "
  done
  for size in "${sizes[@]}"; do
    CLIENT_OUT=$WORK/$name.get.$size rcli "$name" --raw GET "key:$size" || rc=$?
    # --raw prints the value and a newline.
    head -c -1 "$WORK/$name.get.$size" | cmp -s - "$WORK/$name.val.$size" ||
      WHY+="GET of $size bytes: the value read back differs ($(stat -c %s "$WORK/$name.get.$size") bytes); "
  done
  local k v
  for ((i = 0; i < 10000; i++)); do
    k=bulk:$i v=value-$i-$RANDOM
    printf '*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n' ${#k} "$k" ${#v} "$v"
  done >"$WORK/$name.pipe"
  CLIENT_OUT=$WORK/$name.pipe.out rcli "$name" --pipe <"$WORK/$name.pipe" || rc=$?
  grep -q 'errors: 0, replies: 10000' "$WORK/$name.pipe.out" ||
    WHY+="redis-cli --pipe: $(tail -n 1 "$WORK/$name.pipe.out"); "
  CLIENT_OUT=$WORK/$name.dbsize rcli "$name" DBSIZE || rc=$?
  [[ $(tr -d '\r\n' <"$WORK/$name.dbsize") == $((10000 + ${#sizes[@]})) ]] ||
    WHY+="DBSIZE $(head -c 50 "$WORK/$name.dbsize"), want $((10000 + ${#sizes[@]})); "
  local -a keys=()
  for ((i = 0; i < 10000; i += 100)); do keys+=("bulk:$i"); done
  CLIENT_OUT=$WORK/$name.mget rcli "$name" --raw MGET "${keys[@]}" || rc=$?
  # The values as --pipe wrote them (the key's number, then the random part).
  local want got
  want=$(for ((i = 0; i < 10000; i += 100)); do echo "value-$i-"; done)
  got=$(sed 's/^\(value-[0-9]*-\)[0-9]*$/\1/' "$WORK/$name.mget")
  [[ $got == "$want" ]] || WHY+="MGET of 100 keys: the values read back differ; "
  ((rc == 0)) || WHY+="a redis-cli exited with status $rc; "
  # 6 SET + 6 GET + --pipe + DBSIZE + MGET: one connection each.
  redis_stop "$name" redis-cli $((2 * ${#sizes[@]} + 3))
  report "$name" "${WHY%; }"
}

# redis-benchmark NAME CONNS PIPELINE REQUESTS: SET and GET, REQUESTS each, CONNS
# clients, PIPELINE commands per round trip (--csv: requests/s and latency
# percentiles per test). The server's INFO commandstats must count every
# request (SET and GET calls grow by REQUESTS each); redis-benchmark opens one
# connection to read the server's config, then CONNS per test.
redis_bench_case() {
  local name=$1 conns=$2 pipeline=$3 n=$4 rc set0 get0 set1 get1
  want "$name" || return 0
  redis_start "$name" || return
  WHY=""
  set0=$(commandstat "$name" set) get0=$(commandstat "$name" get)
  run_client "$name" "$REDIS_PORT" redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$conns" \
    -P "$pipeline" -n "$n" -t set,get --csv
  rc=$?
  set1=$(commandstat "$name" set) get1=$(commandstat "$name" get)
  ((rc == 0)) || WHY+="redis-benchmark exit status $rc; "
  local t
  for t in SET GET; do
    grep -Eq "^\"$t\",\"[0-9.]+\"" "$WORK/$name.cli.out" || WHY+="no $t result in the CSV; "
  done
  [[ $((${set1:-0} - ${set0:-0})) == "$n" ]] || WHY+="the server ran $((${set1:-0} - ${set0:-0})) SETs, want $n; "
  [[ $((${get1:-0} - ${get0:-0})) == "$n" ]] || WHY+="the server ran $((${get1:-0} - ${get0:-0})) GETs, want $n; "
  # Four INFO calls, one connection each.
  redis_stop "$name" redis-benchmark $((1 + 2 * conns)) redis-cli 4
  report "$name" "${WHY%; }"
}

# ---- memcached -------------------------------------------------------------------

# memcached -t 4 (four worker threads) with the libmemcached tools: files of
# 1 B to 900 KB stored with memccp and read back with memccat (compared byte
# for byte); memcslap sets, then gets, 8 threads x 2000 keys (the server's
# counters, read with memcstat, must count every set and every get as a
# hit); memcaslap (its own load, 16 connections) with every get verified.
memcached_case() {
  local name=memcached port rc=0 size f
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! start_server "$name" "$port" memcached -t 4 -p "$port" -l 127.0.0.1 -U 0 -m 256 \
    -u "$(id -un)"; then
    stop_server
    report "$name" "memcached did not listen on port $port"
    return
  fi
  WHY=""
  local srvs=--servers=127.0.0.1:$port
  local -a files=()
  mkdir -p "$WORK/$name.files" "$WORK/$name.got"
  for size in 1 100 4096 65537 500000 900000; do
    head -c "$size" /dev/urandom >"$WORK/$name.files/f$size"
    files+=("f$size")
  done
  (cd "$WORK/$name.files" && run_client "$name" "$port" memccp "$srvs" "${files[@]}") || rc=$?
  for f in "${files[@]}"; do
    (cd "$WORK/$name.got" && run_client "$name" "$port" memccat "$srvs" "--file=$f" "$f") || rc=$?
    cmp -s "$WORK/$name.files/$f" "$WORK/$name.got/$f" || WHY+="memccat $f: differs from what memccp stored; "
  done
  local s0 s1
  CLIENT_OUT=$WORK/$name.stat0 run_client "$name" "$port" memcstat "$srvs"
  run_client "$name" "$port" memcslap "$srvs" --concurrency=8 --execute-number=2000 --test=set || rc=$?
  run_client "$name" "$port" memcslap "$srvs" --concurrency=8 --execute-number=2000 --test=get || rc=$?
  CLIENT_OUT=$WORK/$name.stat1 run_client "$name" "$port" memcstat "$srvs"
  local key v0 v1
  # set: 16000 (set test) + 2000 (the get test loads its keys); get: 16000, all hits.
  for key in cmd_set:18000 cmd_get:16000 get_hits:16000 get_misses:0; do
    v0=$(sed -n "s/^[[:space:]]*${key%:*}: \([0-9]*\)/\1/p" "$WORK/$name.stat0")
    v1=$(sed -n "s/^[[:space:]]*${key%:*}: \([0-9]*\)/\1/p" "$WORK/$name.stat1")
    [[ $((${v1:-0} - ${v0:-0})) == "${key#*:}" ]] ||
      WHY+="memcached ${key%:*} grew by $((${v1:-0} - ${v0:-0})), want ${key#*:}; "
  done
  CLIENT_OUT=$WORK/$name.aslap run_client "$name" "$port" memcaslap -s "127.0.0.1:$port" -T 2 -c 16 \
    -x 20000 -v 1.0 || rc=$?
  v0=$(sed -n 's/^verify_failed: \([0-9]*\)/\1/p' "$WORK/$name.aslap" | tail -n 1)
  v1=$(sed -n 's/^verify_misses: \([0-9]*\)/\1/p' "$WORK/$name.aslap" | tail -n 1)
  [[ $v0 == 0 && $v1 == 0 ]] || WHY+="memcaslap: verify_failed=${v0:-?} verify_misses=${v1:-?}; "
  grep -q 'Ops: 20000 ' "$WORK/$name.aslap" || WHY+="memcaslap: $(grep -m1 'Ops:' "$WORK/$name.aslap" || echo 'no Ops line'); "
  ((rc == 0)) || WHY+="a client exited with status $rc; "
  stop_server 0 TERM
  local total=0 p
  # memccp 1, memccat 6, memcstat 2, memcslap 8 + 9 (its get test loads
  # the keys over a connection of its own first), memcaslap 16.
  for p in memccp:1 memccat:6 memcstat:2 memcslap:17 memcaslap:16; do
    expect_end "$name" cli "${p%:*}" "${p#*:}"
    total=$((total + E_SHM))
  done
  expect_end "$name" srv memcached "$total"
  report "$name" "${WHY%; }"
}

# ---- fork per connection, inetd ----------------------------------------------------

# fork_case NAME MODE COUNT THREADS BYTES: test/apps/forksrv.c serves COUNT
# connections, each in a child forked for it (MODE: see forksrv.c), to a
# client making them THREADS at a time with BYTES echoed and checked each.
# Stats: the client COUNT shm connections; the parent accepted COUNT on shm;
# each child (for inetd, each exec'd image) takes its connection over and
# counts it again, and wrote one line; the children moved exactly the bytes
# echoed; no fallback, no reset anywhere.
fork_case() {
  local name=$1 mode=$2 count=$3 threads=$4 bytes=$5 port rc
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! start_server "$name" "$port" "$FORKSRV" server --port "$port" --count "$count" --mode "$mode" \
    --exec "$FORKSRV"; then
    stop_server
    report "$name" "forksrv did not listen on port $port"
    return
  fi
  CLIENT_LIMIT=180 run_client "$name" "$port" "$FORKSRV" client --port "$port" --count "$count" \
    --threads "$threads" --bytes "$bytes"
  rc=$?
  stop_server 20 TERM # it exits by itself after COUNT connections
  WHY=""
  ((rc == 0)) || WHY+="client exit status $rc: $(grep -m1 'forksrv client' "$WORK/$name.cli.out"); "
  grep -q "^RESULT connections=$count ok=$count " "$WORK/$name.cli.out" ||
    WHY+="client: $(grep -m1 '^RESULT' "$WORK/$name.cli.out" || echo 'no RESULT line'); "
  ((SERVER_RC == 0)) || WHY+="server exit status $SERVER_RC: $(grep -m1 -v '^READY' "$WORK/$name.srv.out"); "
  grep -q "^SERVED connections=$count children_ok=$count" "$WORK/$name.srv.out" ||
    WHY+="server: $(grep -m1 '^SERVED' "$WORK/$name.srv.out" || echo 'no SERVED line'); "
  [[ -n ${SERVER_LEFTOVERS:-} ]] && WHY+="processes left after the server: $SERVER_LEFTOVERS; "
  SERVER_LEFTOVERS=""
  expect_end "$name" cli forksrv "$count"
  ((E_EARLY > 0)) || [[ $E_SENT == $((count * bytes)) && $E_RECV == $((count * bytes)) ]] ||
    WHY+="client stats: sent $E_SENT, received $E_RECV, want $((count * bytes)) each; "
  local images=$((count + 1)) srv_shm=$((2 * count))
  if [[ $TCP_FIRST == 1 ]]; then
    # A paired connection is counted by the parent and by the child that
    # took it over, one that ended before its pairing once.
    expect_end "$name" srv forksrv ">=$count"
    ((E_SHM - E_EARLY == 2 * (count - E_EARLY))) ||
      WHY+="srv forksrv: $((E_SHM - E_EARLY)) shm connections counted, want 2 x $((count - E_EARLY)); "
  else
    expect_end "$name" srv forksrv "$srv_shm"
  fi
  ((E_EARLY > 0)) || [[ $E_SENT == $((count * bytes)) && $E_RECV == $((count * bytes)) ]] ||
    WHY+="server stats: sent $E_SENT, received $E_RECV, want $((count * bytes)) each; "
  # An exec'd image (inetd) whose connection ended before its pairing holds
  # a plain TCP socket it did not make, and counts nothing: no stats line.
  # (A forked child holds the sockets its parent made: always a line.)
  local n want_lines=$images
  [[ $mode == inetd ]] && want_lines=$((images - E_EARLY))
  n=$(lines_of "$WORK/$name.srv.stats" forksrv)
  [[ $n == "$want_lines" ]] ||
    WHY+="$n server stats lines, want $want_lines (parent + a child each, less $E_EARLY plain ones); "
  report "$name" "${WHY%; }"
}

# ---- Node.js, Java, Python -------------------------------------------------------

# Node.js http: 300 requests (GETs of 0 B to 1 MiB, POSTs echoed) over a
# keep-alive agent of 4 sockets, every body checked: 4 shm connections on
# each end, no more.
node_case() {
  local name=node-http-keepalive port rc node_bin prog
  want "$name" || return 0
  node_bin=$(command -v node || command -v nodejs)
  prog=$(basename "$node_bin")
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! start_server "$name" "$port" "$node_bin" "$HERE/node_http.js" server "$port"; then
    stop_server
    report "$name" "node did not listen on port $port"
    return
  fi
  run_client "$name" "$port" "$node_bin" "$HERE/node_http.js" client "$port" 300 4
  rc=$?
  stop_server 0 TERM
  WHY=""
  ((rc == 0)) || WHY+="client exit status $rc; "
  grep -q '^RESULT requests=300 ok=300 sockets=4$' "$WORK/$name.cli.out" ||
    WHY+="client: $(grep -m1 '^RESULT' "$WORK/$name.cli.out" || echo 'no RESULT line'); "
  expect_end "$name" cli "$prog" 4
  expect_end "$name" srv "$prog" 4
  report "$name" "${WHY%; }"
}

# A blocking java.net echo, launched as single source files (java X.java):
# 8 connections at once, 1 MB each way on each (a reader and a writer
# thread per client socket), every byte checked: 8 shm connections and
# exactly 8 MB each way on each end.
java_case() {
  local name=java-echo port rc n=8 bytes=1000000
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! start_server "$name" "$port" java "$HERE/EchoJava.java" server "$port" "$n"; then
    stop_server
    report "$name" "java did not listen on port $port"
    return
  fi
  CLIENT_LIMIT=180 run_client "$name" "$port" java "$HERE/EchoJava.java" client "$port" "$n" "$bytes"
  rc=$?
  stop_server 30 TERM # it exits by itself after n connections
  WHY=""
  ((rc == 0)) || WHY+="client exit status $rc; "
  grep -q "^RESULT connections=$n ok=$n bytes=$((n * bytes))\$" "$WORK/$name.cli.out" ||
    WHY+="client: $(grep -m1 '^RESULT' "$WORK/$name.cli.out" || echo 'no RESULT line'); "
  grep -q "^SERVED connections=$n echoed=$((n * bytes))\$" "$WORK/$name.srv.out" ||
    WHY+="server: $(grep -m1 '^SERVED' "$WORK/$name.srv.out" || echo 'no SERVED line'); "
  local side
  for side in cli srv; do
    expect_end "$name" "$side" java "$n"
    ((E_EARLY > 0)) || [[ $E_SENT == $((n * bytes)) && $E_RECV == $((n * bytes)) ]] ||
      WHY+="$side stats: sent $E_SENT, received $E_RECV, want $((n * bytes)) each; "
  done
  report "$name" "${WHY%; }"
}

# socketserver.ThreadingTCPServer (unmodified: its listen backlog is 5) and
# 8 client threads connecting at once, 20 questions each (1 B to 256 KiB
# answers), every answer checked: 8 shm connections on each end. With
# librsock's default pairing bound (1 s): a connection that overflowed the
# backlog would wait for the kernel's first SYN-ACK retransmission, 1 s, and
# fall back (README, bug 3).
python_case() {
  local name=python-threading port rc n=8 PAIR_MS=1000
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! start_server "$name" "$port" "$PYTHON" "$HERE/py_threading.py" server "$port" "$n"; then
    stop_server
    report "$name" "python did not listen on port $port"
    return
  fi
  run_client "$name" "$port" "$PYTHON" "$HERE/py_threading.py" client "$port" "$n" 20
  rc=$?
  stop_server 20 TERM # it exits by itself after n connections
  WHY=""
  ((rc == 0)) || WHY+="client exit status $rc; "
  grep -q "^RESULT connections=$n ok=$n answers=$((n * 20))\$" "$WORK/$name.cli.out" ||
    WHY+="client: $(grep -m1 '^RESULT' "$WORK/$name.cli.out" || echo 'no RESULT line'); "
  grep -q "^SERVED connections=$n\$" "$WORK/$name.srv.out" ||
    WHY+="server: $(grep -m1 '^SERVED' "$WORK/$name.srv.out" || echo 'no SERVED line'); "
  local prog
  prog=$(basename "$PYTHON") # the shim names a program after its argv[0]
  expect_end "$name" cli "$prog" "$n"
  expect_end "$name" srv "$prog" "$n"
  report "$name" "${WHY%; }"
}

# Echo of whole messages: py_threading.py echo-server (the `py-threaded` bench
# row), 8 client threads each sending 4 x 1 MiB, every message whole before
# it reads the echo. More than both rings (2 x 256 KiB) hold: each end waits
# in a send (Python's sendall polls for POLLOUT, having a timeout) while the
# other does too, and one of them must take the other's bytes out of its
# full ring for both to go on (Stream::relieve), as kernel TCP's receive
# queue does. The stats must show it did.
python_echo_case() {
  local name=python-echo-1m port rc n=8
  want "$name" || return 0
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  if ! SERVER_LIMIT=40 start_server "$name" "$port" "$PYTHON" "$HERE/py_threading.py" echo-server \
    "$port" "$n"; then
    stop_server
    report "$name" "python did not listen on port $port"
    return
  fi
  CLIENT_LIMIT=15 run_client "$name" "$port" "$PYTHON" "$HERE/py_threading.py" echo-client "$port" \
    "$n" 4 1048576
  rc=$?
  stop_server 5 TERM # it exits by itself after n connections
  WHY=""
  ((rc == 0)) || WHY+="client exit status $rc$( ((rc == 124)) && echo ' (no progress in 15 s)'); "
  grep -q "^RESULT connections=$n ok=$n bytes=$((n * 4 * 1048576)) " "$WORK/$name.cli.out" ||
    WHY+="client: $(grep -m1 '^RESULT' "$WORK/$name.cli.out" || echo 'no RESULT line'); "
  local prog
  prog=$(basename "$PYTHON")
  expect_end "$name" cli "$prog" "$n"
  expect_end "$name" srv "$prog" "$n"
  local held_c held_s
  held_c=$(stat_of "$WORK/$name.cli.stats" "$prog" .held.bytes)
  held_s=$(stat_of "$WORK/$name.srv.stats" "$prog" .held.bytes)
  ((${held_c:-0} + ${held_s:-0} > 0)) || WHY+="neither end held bytes (stats held.bytes): the case did not need relieving; "
  report "$name" "${WHY%; }"
}

# ---- main ------------------------------------------------------------------------

ensure_tools
if [[ ! -f $LIB ]]; then
  echo "apps: $LIB not found: run 'make' first" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

for io in select poll epoll; do
  sockperf_case "sockperf-pingpong-$io" pp "$io"
  sockperf_case "sockperf-throughput-$io" tp "$io"
done
sockperf_case sockperf-underload-epoll ul epoll
iperf3_case iperf3 0 1
iperf3_case iperf3-reverse 1 1
iperf3_case iperf3-P8 0 8
iperf3_case iperf3-P8-reverse 1 8
iperf2_case iperf 0
iperf2_case iperf-reverse 1
nginx_files_case on
nginx_files_case off
nginx_wrk_case
nginx_ab_case
redis_cli_case
redis_bench_case redis-benchmark-c1 1 1 20000
redis_bench_case redis-benchmark-c50-P16 50 16 200000
memcached_case
fork_case fork-at-once at-once 200 4 65536
fork_case fork-child-exit child-exit 200 4 65536
fork_case fork-late-close late-close 200 4 65536
fork_case fork-thousands at-once 2000 1 1000
fork_case inetd inetd 200 4 65536
node_case
java_case
python_case
python_echo_case

((KEEP)) && echo "apps: logs of failed cases kept in $WORK" >&2
[[ -n $KNOWN_SEEN ]] && echo "apps: known bugs showed (not counted, see the README's compatibility table):$KNOWN_SEEN"
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
