#!/usr/bin/env bash
# Application benchmark rows of `make bench` (run by benchmarks/run.sh, or
# alone: bash benchmarks/apps.sh): unmodified servers and load tools over
# kernel TCP loopback and over librsock (preloaded into both, shared memory
# checked in RSOCK_STATS), the server pinned to one cpu and the tool to the
# other:
#   redis -c 1         redis-benchmark -c 1 -t set,get: requests/s, p50, p99
#   redis -c 50 -P 16  redis-benchmark -c 50 -P 16 -t set,get: same
#   memcached -c 1     memcaslap (Debian's memaslap) -T 1 -c 1 -t Ns against
#                      memcached -t 2: ops/s and the geometric mean latency
#   memcached -c 16    memcaslap -T 1 -c 16: ops/s
#   nginx + wrk        nginx (2 workers, sendfile on, a 4 KiB file) and
#                      wrk -t 1 -c 16 --latency: requests/s, p50, p99
#   nginx-ab           the same nginx without keep-alive and
#                      ab -n 2000 -c 1: a new connection per request (issue
#                      9's complaint), requests/s and the mean us of one;
#                      each connection must be counted on shm or as one
#                      that ended before its pairing, or the run is INVALID
#   nginx-ab-eager     the same with eager pairing (RSOCK_TCP_FIRST=0 on
#                      both ends): every connection pairs inside connect()
#                      and accept(), and must be counted on shm
#   java-echo          benchmarks/JavaEcho.java: 64-byte round trips over
#                      blocking java.net sockets (OpenJDK), 20,000 after a
#                      warm-up: p50 and p99 us of one round trip
#   pingpong-sleep     benchmarks/pingpong.cpp: 20,000 blocking 64-byte round
#                      trips (send, then recv) after 2,000 unmeasured, with
#                      RSOCK_SPIN_US=0 on both librsock ends, so that a call
#                      that waits sleeps at once (the cost of a hop that
#                      sleeps, issue 9): p50 and p99 us of a hop (half a
#                      round trip) and the client's CPU us per round trip
#   py-threaded        test/apps/py_threading.py echo-server/echo-client: a
#                      Python ThreadingTCPServer echoing 128 x 256 KiB to
#                      each of 8 client threads (a thread per connection,
#                      blocking calls, every byte checked): MB/s echoed
#   py-threaded-1m     the same with 32 x 1 MiB messages, each sent whole
#                      before its echo is read: more than both rings hold,
#                      so the ends wait in a send for each other, and take
#                      the other's bytes out of a full ring (README,
#                      Compatibility, bug 4)
#   conns-block        benchmarks/connrate.cpp: 2000 x (connect, 1 byte each
#                      way, close), one after the other, against a blocking
#                      accept loop: connections/s, p50 and p99 of one
#                      connection (socket() to the byte back), and the CPU
#                      time (user and system) each process spent per
#                      connection
#   conns-epoll        the same with nonblocking connects, 8 in flight, from
#                      an epoll loop to an epoll server
#                      In the default mode every connection ends on TCP
#                      before its pairing, which the stats must show on
#                      both ends (closed_before_pairing for each one) or
#                      the run is INVALID
#   conns-block-eager, conns-epoll-eager
#                      the same two with eager pairing (RSOCK_TCP_FIRST=0
#                      on both ends): every connection pairs, on shm
#   stream-SIZE        benchmarks/stream.cpp: one connection streaming
#                      SIZE-byte sends for BENCH_STREAM_SECONDS (default 1)
#                      into a reader of 65,000-byte recvs, for SIZE = 64 B,
#                      1 KiB, 16 KiB, 64 KiB, 256 KiB and 1 MiB: MB/s
#                      received, and the CPU time of both processes per GB
#                      (a spinning wait counts: it is CPU the host pays)
#   idle-conns         connrate hold/sink: 1000 connections that each carried
#                      1 MiB; what one costs the client and the server (fds,
#                      virtual, resident and pinned KiB, from /proc/self),
#                      against each process's state before: at once, and
#                      resident again after 3 s idle (librsock gives an idle
#                      ring's pages back after a second)
#   conns-10k          connrate hold/sink with 10,000 connections of one
#                      byte each way: the seconds to open them all (one
#                      after the other), the seconds until the client's
#                      descriptor count held still (its last connection
#                      paired in the background), then fds and KiB as above. A
#                      librsock connection holds one fd, as on TCP (two
#                      until 2026-12-06), so where RLIMIT_NOFILE cannot
#                      grow to 10,000 + 2,000 the row opens as many as fit
#                      (both paths alike) and its label says how many
# Each measurement runs BENCH_REPEAT times (default 3), TCP and librsock
# alternating; the table shows the median of the runs, the spread (min-max)
# and the ratio librsock/TCP (for latency TCP/librsock: above 1 is better
# for librsock either way). librsock runs in its default mode (a connection
# starts on TCP and pairs RSOCK_PAIR_DELAY_MS later) except in the -eager
# rows. A librsock run whose stats do not show shared memory on both ends
# (or show a plain TCP connection that did not end before its pairing) is
# INVALID and makes the script exit 1. The table goes to stdout and to
# $BUILD/bench/apps.md, its numbers to $BUILD/bench/data/apps.tsv (for the
# plots of benchmarks/report.sh). Progress goes to stderr as "case K of N".
# Knobs: BENCH_REPEAT, BENCH_SECONDS (per wrk/memcaslap run, default 3),
# BENCH_STREAM_SECONDS, BENCH_CPUS ("SERVER CLIENT", default "0 1"),
# BENCH_APPS (a regex of row names to run), BUILD. Runtime: about
# 14 x 2 x REPEAT runs of ~5 s and 6 x 2 x REPEAT stream runs of ~2 s, ~4 min.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LIB=$BUILD/librsock.so
OUT_DIR=$BUILD/bench
REPEAT=${BENCH_REPEAT:-3}
SECS=${BENCH_SECONDS:-3}
ONLY=${BENCH_APPS:-.}
read -r CPU_SRV CPU_CLI <<<"${BENCH_CPUS:-0 1}"
STREAM_SECS=${BENCH_STREAM_SECONDS:-1}
# conns-10k holds 10,000 connections in each process: room for one fd each,
# or as many connections as the hard limit allows, less 2,000 for the
# pairings in flight (in the default mode a burst of connections pairs in
# the background, each pairing holding a few descriptors for a while: with
# 200 to spare, 6,600 connections met EMFILE in 2 runs of 3).
(($(ulimit -n) >= 65536)) || ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
MANY=10000
NOFILE=$(ulimit -n)
[[ $NOFILE == unlimited ]] || (((MANY + 2000) <= NOFILE)) || MANY=$(((NOFILE - 2000) / 100 * 100))
WORK=$(mktemp -d /tmp/rsock-bench-apps.XXXXXX)
SERVER_PID=""
FAILED=0

cleanup() {
  if [[ -n $SERVER_PID ]]; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null
    sleep 0.3
    kill -KILL -- "-$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
  echo "bench-apps: $*" >&2
  exit 2
}
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPEAT='$REPEAT': a whole number, 1 or more"
[[ $SECS =~ ^[1-9][0-9]*$ ]] || die "BENCH_SECONDS='$SECS': a whole number of seconds, 1 or more"
[[ $STREAM_SECS =~ ^[0-9]+(\.[0-9]+)?$ && ! $STREAM_SECS =~ ^0+(\.0*)?$ ]] ||
  die "BENCH_STREAM_SECONDS='$STREAM_SECS': a number of seconds above 0"

PYTHON=/usr/bin/python3
[[ -x $PYTHON ]] || PYTHON=$(command -v python3)
PY_ECHO=$ROOT/test/apps/py_threading.py
for tool in redis-server redis-benchmark memcached memcaslap nginx wrk ab java javac python3 taskset setsid jq; do
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
    die "$tool missing (make deps installs the Debian packages)"
done
[[ -f $LIB ]] || die "$LIB not found: run 'make' first"
if (($(nproc) < 2)); then
  echo "bench-apps: WARNING: only $(nproc) cpu; server and client share it" >&2
  CPU_SRV=0 CPU_CLI=0
fi

free_port() {
  local lo p i
  read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
  ((lo > 12000)) || lo=32768
  for ((i = 0; i < 200; i++)); do
    p=$((10000 + RANDOM % (lo - 10000)))
    [[ -z $(ss -tanH "( sport = :$p )" 2>/dev/null) ]] && {
      echo "$p"
      return 0
    }
  done
  die "no free port"
}

# path_env PATH SIDE TAG PORT: the env prefix of a process (PATH tcp: none).
RSOCK_EXTRA=() # more environment for librsock runs (pingpong-sleep)
EAGER=0        # 1: the row's librsock runs pair eagerly (RSOCK_TCP_FIRST=0)
path_env() {
  if [[ $1 == rsock ]]; then
    ENVP=(env LD_PRELOAD="$LIB" RSOCK_PEERS="127.0.0.1:$4" RSOCK_STATS="$WORK/$3.$2.stats"
      RSOCK_TCP_FIRST=$((1 - EAGER)) "${RSOCK_EXTRA[@]}")
  else
    ENVP=(env -u LD_PRELOAD)
  fi
}

# start_server PATH TAG PORT CMD...: pinned, in its own process group.
start_server() {
  local path=$1 tag=$2 port=$3 i
  shift 3
  path_env "$path" srv "$tag" "$port"
  setsid taskset -c "$CPU_SRV" "${ENVP[@]}" "$@" >"$WORK/$tag.srv.out" 2>&1 &
  SERVER_PID=$!
  for ((i = 0; i < 200; i++)); do
    [[ -n $(ss -ltnH "( sport = :$port )" 2>/dev/null) ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# stop_server SIGNAL: the server exits (writing its stats line), then
# whatever is left of its group is killed.
stop_server() {
  local i
  [[ -n $SERVER_PID ]] || return 0
  kill "-$1" "$SERVER_PID" 2>/dev/null
  for ((i = 0; i < 100; i++)); do
    kill -0 -- "-$SERVER_PID" 2>/dev/null || break
    sleep 0.05
  done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
}

# await_server_exit: up to 5 s for a server that exits by itself once it
# has answered (its stats line then written); stop_server is for one that
# hangs.
await_server_exit() {
  local i
  for ((i = 0; i < 100; i++)); do
    kill -0 "$SERVER_PID" 2>/dev/null || return 0
    sleep 0.05
  done
}

# run_client PATH TAG PORT CMD...: pinned to the other cpu, bounded.
run_client() {
  local path=$1 tag=$2 port=$3
  shift 3
  path_env "$path" cli "$tag" "$port"
  timeout -k 5 $((SECS + 120)) taskset -c "$CPU_CLI" "${ENVP[@]}" "$@" >"$WORK/$tag.cli.out" 2>&1
}

# check_shm TAG SERVER_PROG CLIENT_PROG: both ends over shm, and a
# connection on TCP only where it ended before its pairing (a tool's short
# connection beside the measured ones, in the default mode); else a note.
check_shm() {
  local tag=$1 side prog f v shm tcp early
  for side in srv cli; do
    prog=$2
    [[ $side == cli ]] && prog=$3
    f=$WORK/$tag.$side.stats
    v=$(jq -s -r --arg p "$prog" '[.[] | select(.program == $p)] |
      "\(map(.connections.shm) | add // 0) \(map(.connections.tcp) | add // 0)" +
      " \(map(.fallbacks.closed_before_pairing // 0) | add // 0)"' "$f" 2>/dev/null)
    read -r shm tcp early <<<"${v:-x x x}"
    if ! [[ $shm -ge 1 && $tcp == "$early" ]] 2>/dev/null; then
      R_NOTE+="NOT OVER SHM: $side $prog shm/tcp/closed_before_pairing = ${v:-no stats}; "
      R_OK=0
    fi
  done
}

# check_tcp_first TAG PROG: every connection of both ends counted on TCP as
# one that ended before its pairing (librsock ran the tcp-first path for
# each); else a note.
check_tcp_first() {
  local tag=$1 side f v shm tcp early
  for side in srv cli; do
    f=$WORK/$tag.$side.stats
    v=$(jq -s -r --arg p "$2" '[.[] | select(.program == $p)] |
      "\(map(.connections.shm) | add // 0) \(map(.connections.tcp) | add // 0)" +
      " \(map(.fallbacks.closed_before_pairing // 0) | add // 0)"' "$f" 2>/dev/null)
    read -r shm tcp early <<<"${v:-x x x}"
    if [[ $shm != 0 || $tcp != "$early" || $early -lt $CONNS ]]; then
      R_NOTE+="NOT TCP-FIRST: $side $2 shm/tcp/closed_before_pairing = ${v:-no stats}; "
      R_OK=0
    fi
  done
}

# ---- one run of each tool: sets R_OK, R_NOTE and R[metric] ------------------

declare -A R
run_redis() { # PATH CONNS PIPELINE REQUESTS
  local path=$1 c=$2 p=$3 n=$4 port tag
  port=$(free_port) tag=redis-c$c-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  mkdir -p "$WORK/$tag.dir"
  start_server "$path" "$tag" "$port" redis-server --port "$port" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$WORK/$tag.dir" --logfile '' || {
    R_OK=0 R_NOTE="redis-server did not start"
    stop_server TERM
    return
  }
  run_client "$path" "$tag" "$port" redis-benchmark -h 127.0.0.1 -p "$port" -c "$c" -P "$p" -n "$n" \
    -t set,get --csv || R_NOTE+="redis-benchmark status $?; "
  stop_server TERM
  local t line
  for t in SET GET; do
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms",...
    line=$(grep "^\"$t\"," "$WORK/$tag.cli.out" | tr -d '"')
    if [[ -z $line ]]; then
      R_OK=0 R_NOTE+="no $t result; "
      continue
    fi
    R[$t.rps]=$(cut -d, -f2 <<<"$line")
    R[$t.p50]=$(awk -F, '{printf "%.1f", $5 * 1000}' <<<"$line")
    R[$t.p99]=$(awk -F, '{printf "%.1f", $7 * 1000}' <<<"$line")
  done
  [[ $path == rsock ]] && check_shm "$tag" redis-server redis-benchmark
}

run_memcached() { # PATH CONNS
  local path=$1 c=$2 port tag
  port=$(free_port) tag=memcached-c$c-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  start_server "$path" "$tag" "$port" memcached -t 2 -p "$port" -l 127.0.0.1 -U 0 -m 256 \
    -u "$(id -un)" || {
    R_OK=0 R_NOTE="memcached did not start"
    stop_server TERM
    return
  }
  run_client "$path" "$tag" "$port" memcaslap -s "127.0.0.1:$port" -T 1 -c "$c" -t "${SECS}s" \
    -S "${SECS}s" || R_NOTE+="memcaslap status $?; "
  stop_server TERM
  R[tps]=$(sed -n 's/.*Ops: [0-9]* TPS: \([0-9]*\).*/\1/p' "$WORK/$tag.cli.out" | tail -n 1)
  # "Total Statistics (N events)" ... "Geo: X" (geometric mean, us)
  R[geo]=$(sed -n '/^Total Statistics (/,/Geo:/s/^ *Geo: *\([0-9.]*\).*/\1/p' "$WORK/$tag.cli.out" | tail -n 1)
  [[ -n ${R[tps]} ]] || {
    R_OK=0 R_NOTE+="no TPS in memcaslap's output; "
  }
  [[ $path == rsock ]] && check_shm "$tag" memcached memcaslap
}

run_nginx() { # PATH [ab]: wrk with keep-alive, or ab with a connection per request
  local path=$1 client=${2:-wrk} port tag prefix keepalive=60
  port=$(free_port) tag=nginx-$client-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  [[ $client == ab ]] && keepalive=0
  prefix=$WORK/$tag.nginx
  mkdir -p "$prefix/www" "$prefix/tmp" "$prefix/logs"
  head -c 4096 /dev/urandom >"$prefix/www/page.bin"
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
  sendfile on;
  tcp_nopush on;
  keepalive_timeout $keepalive;
  keepalive_requests 10000000;
  default_type application/octet-stream;
  client_body_temp_path $prefix/tmp/body;
  proxy_temp_path $prefix/tmp/proxy;
  fastcgi_temp_path $prefix/tmp/fastcgi;
  uwsgi_temp_path $prefix/tmp/uwsgi;
  scgi_temp_path $prefix/tmp/scgi;
  server { listen 127.0.0.1:$port; root $prefix/www; }
}
EOF
  start_server "$path" "$tag" "$port" "$(command -v nginx || echo /usr/sbin/nginx)" -p "$prefix" \
    -c "$prefix/nginx.conf" -e "$prefix/logs/error.log" || {
    R_OK=0 R_NOTE="nginx did not start"
    stop_server QUIT
    return
  }
  if [[ $client == ab ]]; then
    run_nginx_ab "$path" "$tag" "$port"
    return
  fi
  run_client "$path" "$tag" "$port" wrk -t 1 -c 16 -d "${SECS}s" --latency \
    "http://127.0.0.1:$port/page.bin" || R_NOTE+="wrk status $?; "
  stop_server QUIT
  local out=$WORK/$tag.cli.out v
  R[rps]=$(sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' "$out")
  for v in 50 99; do
    # "     50%   85.00us" (us, ms or s)
    R[p$v]=$(awk -v q="$v%" '$1 == q { x = $2; u = x; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", x);
      if (u == "ms") x *= 1000; else if (u == "s") x *= 1000000; printf "%.1f", x }' "$out")
  done
  grep -q 'Socket errors\|Non-2xx' "$out" && R_NOTE+="wrk: $(grep -m1 'Socket errors\|Non-2xx' "$out" | tr -s ' '); "
  [[ -n ${R[rps]} ]] || {
    R_OK=0 R_NOTE+="no Requests/sec in wrk's output; "
  }
  [[ $path == rsock ]] && check_shm "$tag" nginx wrk
}

# The ab half of run_nginx (its server started): AB_REQUESTS requests, one
# connection each.
AB_REQUESTS=2000
run_nginx_ab() { # PATH TAG PORT
  local path=$1 tag=$2 port=$3 out=$WORK/$2.cli.out
  run_client "$path" "$tag" "$port" ab -q -n "$AB_REQUESTS" -c 1 "http://127.0.0.1:$port/page.bin" ||
    R_NOTE+="ab status $?; "
  stop_server QUIT
  R[rps]=$(sed -n 's/^Requests per second: *\([0-9.]*\).*/\1/p' "$out")
  # "Time per request:       93.541 [ms] (mean)"
  R[mean]=$(awk '/^Time per request:.*\(mean\)$/ { printf "%.1f", $4 * 1000; exit }' "$out")
  local fails
  fails=$(sed -n 's/^Failed requests: *\([0-9]*\).*/\1/p' "$out")
  [[ -n ${R[rps]} && $fails == 0 ]] || {
    R_OK=0 R_NOTE+="ab: ${R[rps]:-no rate}, failed requests ${fails:-?}; "
  }
  [[ $path == rsock ]] && check_shm_or_early "$tag" nginx ab
}

# check_shm_or_early TAG SERVER_PROG CLIENT_PROG: every connection of both
# ends counted over shm or on TCP as one that ended before its pairing
# (none with eager pairing), none for another reason, AB_REQUESTS of the
# client's; else a note.
check_shm_or_early() {
  local tag=$1 side prog f v shm tcp early
  for side in srv cli; do
    prog=$2
    [[ $side == cli ]] && prog=$3
    f=$WORK/$tag.$side.stats
    v=$(jq -s -r --arg p "$prog" '[.[] | select(.program == $p)] |
      "\(map(.connections.shm) | add // 0) \(map(.connections.tcp) | add // 0)" +
      " \(map(.fallbacks.closed_before_pairing // 0) | add // 0)"' "$f" 2>/dev/null)
    read -r shm tcp early <<<"${v:-x x x}"
    if [[ $tcp != "$early" || $((shm + tcp)) -lt $AB_REQUESTS ]] 2>/dev/null; then
      R_NOTE+="NOT SHM OR TCP-FIRST: $side $prog shm/tcp/closed_before_pairing = ${v:-no stats}; "
      R_OK=0
    fi
  done
}

run_java() { # PATH
  local path=$1 port tag line
  port=$(free_port) tag=java-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  start_server "$path" "$tag" "$port" java -cp "$WORK" JavaEcho server "$port" || {
    R_OK=0 R_NOTE="JavaEcho server did not start"
    stop_server TERM
    return
  }
  run_client "$path" "$tag" "$port" java -cp "$WORK" JavaEcho client "$port" 20000 ||
    R_NOTE+="JavaEcho client status $?; "
  stop_server TERM
  line=$(grep -m1 '^RESULT ' "$WORK/$tag.cli.out")
  R[p50]=$(sed -n 's/.* p50_us=\([0-9.]*\).*/\1/p' <<<"$line")
  R[p99]=$(sed -n 's/.* p99_us=\([0-9.]*\).*/\1/p' <<<"$line")
  [[ -n ${R[p50]} ]] || {
    R_OK=0 R_NOTE+="JavaEcho: ${line:-no RESULT line}; "
  }
  [[ $path == rsock ]] && check_shm "$tag" java java
}

run_pingpong() { # PATH
  local path=$1 port tag line
  port=$(free_port) tag=pingpong-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  RSOCK_EXTRA=(RSOCK_SPIN_US=0)
  start_server "$path" "$tag" "$port" "$PINGPONG" server 127.0.0.1 "$port" || {
    R_OK=0 R_NOTE="pingpong server did not start"
    stop_server TERM
    RSOCK_EXTRA=()
    return
  }
  run_client "$path" "$tag" "$port" "$PINGPONG" client 127.0.0.1 "$port" 64 20000 2000 ||
    R_NOTE+="pingpong client status $?; "
  await_server_exit
  stop_server TERM
  RSOCK_EXTRA=()
  line=$(grep -m1 '^pingpong: size=' "$WORK/$tag.cli.out")
  R[p50]=$(sed -n 's/.* p50_us=\([0-9.]*\).*/\1/p' <<<"$line")
  R[p99]=$(sed -n 's/.* p99_us=\([0-9.]*\).*/\1/p' <<<"$line")
  R[cpu]=$(sed -n 's/.* cpu_us=\([0-9.]*\).*/\1/p' <<<"$line")
  [[ -n ${R[p50]} ]] || {
    R_OK=0 R_NOTE+="pingpong: ${line:-no result line}; "
  }
  [[ $path == rsock ]] && check_shm "$tag" pingpong pingpong
}

run_py() { # PATH MESSAGES SIZE
  local path=$1 messages=$2 size=$3 port tag line
  port=$(free_port) tag=py-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  start_server "$path" "$tag" "$port" "$PYTHON" "$PY_ECHO" echo-server "$port" 8 || {
    R_OK=0 R_NOTE="py_threading echo-server did not start"
    stop_server TERM
    return
  }
  run_client "$path" "$tag" "$port" "$PYTHON" "$PY_ECHO" echo-client "$port" 8 "$messages" "$size" ||
    R_NOTE+="py_threading echo-client status $?; "
  await_server_exit
  stop_server TERM
  line=$(grep -m1 '^RESULT ' "$WORK/$tag.cli.out")
  R[mbs]=$(sed -n 's/.* MBps=\([0-9.]*\).*/\1/p' <<<"$line")
  [[ $line == *" ok=8 "* && -n ${R[mbs]} ]] || {
    R_OK=0 R_NOTE+="py_threading: ${line:-no RESULT line}; "
  }
  [[ $path == rsock ]] && check_shm "$tag" "$(basename "$PYTHON")" "$(basename "$PYTHON")"
}

run_conns() { # PATH MODE
  local path=$1 mode=$2 port tag
  port=$(free_port) tag=conns-$mode-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  start_server "$path" "$tag" "$port" "$CONNRATE" server "$port" "$mode" || {
    R_OK=0 R_NOTE="connrate server did not start"
    stop_server TERM
    return
  }
  run_client "$path" "$tag" "$port" "$CONNRATE" client "$port" "$CONNS" "$mode" 8 ||
    R_NOTE+="connrate client status $?; "
  stop_server TERM
  local line
  line=$(grep -m1 '^RESULT ' "$WORK/$tag.cli.out")
  R[rate]=$(sed -n 's/.* rate=\([0-9.]*\).*/\1/p' <<<"$line")
  R[p50]=$(sed -n 's/.* p50_us=\([0-9.]*\).*/\1/p' <<<"$line")
  R[p99]=$(sed -n 's/.* p99_us=\([0-9.]*\).*/\1/p' <<<"$line")
  R[cli_cpu]=$(sed -n 's/.* cpu_us=\([0-9.]*\).*/\1/p' <<<"$line")
  R[srv_cpu]=$(sed -n 's/^SERVED .* cpu_us=\([0-9.]*\).*/\1/p' "$WORK/$tag.srv.out")
  [[ $line == *" ok=$CONNS "* ]] || {
    R_OK=0 R_NOTE+="connrate: ${line:-no RESULT line}; "
  }
  if [[ $path == rsock && $EAGER == 0 ]]; then
    check_tcp_first "$tag" connrate
  elif [[ $path == rsock ]]; then
    check_shm "$tag" connrate connrate
  fi
}

run_stream() { # PATH SIZE
  local path=$1 size=$2 port tag
  port=$(free_port) tag=stream-$size-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  start_server "$path" "$tag" "$port" "$STREAM" server 127.0.0.1 "$port" || {
    R_OK=0 R_NOTE="stream server did not start"
    stop_server TERM
    return
  }
  run_client "$path" "$tag" "$port" "$STREAM" client 127.0.0.1 "$port" "$size" "$STREAM_SECS" ||
    R_NOTE+="stream client status $?; "
  await_server_exit
  stop_server TERM
  local bytes cpu_s cpu_c
  R[mbs]=$(sed -n 's/.* MBps=\([0-9.]*\).*/\1/p' "$WORK/$tag.srv.out")
  bytes=$(sed -n 's/.*received=\([0-9]*\).*/\1/p' "$WORK/$tag.srv.out")
  cpu_s=$(sed -n 's/.*cpu=\([0-9.]*\).*/\1/p' "$WORK/$tag.srv.out")
  cpu_c=$(sed -n 's/.*cpu=\([0-9.]*\).*/\1/p' "$WORK/$tag.cli.out")
  if [[ -z ${R[mbs]} || -z $bytes || -z $cpu_s || -z $cpu_c ]] || ((bytes == 0)); then
    R_OK=0 R_NOTE+="stream: no result ($(tail -n 1 "$WORK/$tag.cli.out")); "
    return
  fi
  R[cpu]=$(awk -v a="$cpu_s" -v b="$cpu_c" -v n="$bytes" 'BEGIN { printf "%.1f", (a + b) * 1000 / (n / 1e9) }')
  [[ $path == rsock ]] && check_shm "$tag" stream stream
}

run_idle() { # PATH K BYTES [IDLE_MS]
  local path=$1 k=$2 bytes=$3 idle_ms=${4:-} port tag cli i want=RESULT
  [[ -n $idle_ms ]] && want=IDLE
  port=$(free_port) tag=idle-$path-$RANDOM
  R_OK=1 R_NOTE="" R=()
  start_server "$path" "$tag" "$port" "$CONNRATE" sink "$port" "$k" "$bytes" $idle_ms || {
    R_OK=0 R_NOTE="connrate sink did not start"
    stop_server TERM
    return
  }
  path_env "$path" cli "$tag" "$port"
  taskset -c "$CPU_CLI" "${ENVP[@]}" "$CONNRATE" hold "$port" "$k" "$bytes" $idle_ms >"$WORK/$tag.cli.out" 2>&1 &
  cli=$!
  for ((i = 0; i < 1200; i++)); do
    grep -q "^$want" "$WORK/$tag.cli.out" && grep -q "^$want" "$WORK/$tag.srv.out" && break
    kill -0 "$cli" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$cli" 2>/dev/null
  wait "$cli" 2>/dev/null
  stop_server TERM
  local side line m
  for side in cli srv; do
    line=$(grep -m1 '^RESULT' "$WORK/$tag.$side.out")
    [[ -n $line ]] || {
      R_OK=0 R_NOTE+="$side: no RESULT line; "
      continue
    }
    for m in fds vm_kib rss_kib pinned_kib seconds settled; do
      R[$side.$m]=$(sed -n "s/.* $m=\([0-9.-]*\).*/\1/p" <<<"$line")
    done
    [[ -n $idle_ms ]] || continue
    line=$(grep -m1 '^IDLE' "$WORK/$tag.$side.out")
    [[ -n $line ]] || {
      R_OK=0 R_NOTE+="$side: no IDLE line; "
      continue
    }
    R[$side.idle_rss_kib]=$(sed -n "s/.* rss_kib=\([0-9.-]*\).*/\1/p" <<<"$line")
  done
  [[ $path == rsock ]] && check_shm "$tag" connrate connrate
}

# ---- statistics ---------------------------------------------------------------

# spread VALUES...: "median<TAB>min<TAB>max" of the numbers given ("" if
# none).
spread() {
  tr ' ' '\n' <<<"$*" | grep -E '^[0-9.]+$' | sort -g |
    awk '{v[NR] = $1} END { if (NR) printf "%.10g\t%.10g\t%.10g",
      (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR] }'
}
# med_spread VALUES...: "median (min-max)" of the numbers given.
med_spread() {
  spread "$@" | awk -F'\t' '{ f = ($1 >= 100) ? "%.0f" : "%.1f"; printf f " (" f "-" f ")", $1, $2, $3 }
    END { if (!NR) print "n/a" }'
}
median() { med_spread "$@" | cut -d' ' -f1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 == 0 || b + 0 == 0) print "n/a"; else printf "%.2fx", a / b }'; }

# ---- main -------------------------------------------------------------------------

declare -A V      # "row.metric.path" -> values of the runs
declare -A NOTES  # "row.path" -> notes
declare -A BAD    # "row.path" -> 1 when a run was invalid
ROWS=()
want() { [[ $1 =~ $ONLY ]]; }

record() { # ROW PATH METRIC...: appends R[metric] of the last run
  local row=$1 path=$2 m
  shift 2
  for m in "$@"; do V[$row.$m.$path]+="${R[$m]:-} "; done
  ((R_OK)) || BAD[$row.$path]=1
  [[ -n $R_NOTE ]] && NOTES[$row.$path]+="$R_NOTE"
}

STREAM_SIZES="64 1024 16384 65536 262144 1048576"
for row in redis-c1 redis-c50-P16 memcached-c1 memcached-c16 nginx-wrk nginx-ab nginx-ab-eager \
  java-echo pingpong-sleep \
  py-threaded \
  py-threaded-1m \
  conns-block conns-epoll \
  conns-block-eager conns-epoll-eager \
  $(printf 'stream-%s ' $STREAM_SIZES) idle-conns conns-10k; do
  want "$row" && ROWS+=("$row")
done
((${#ROWS[@]})) || die "BENCH_APPS='$ONLY' selects no row"
CONNS=2000
CONNRATE=$WORK/connrate
g++ -std=c++20 -O2 -o "$CONNRATE" "$ROOT/benchmarks/connrate.cpp" || die "building connrate failed"
STREAM=$WORK/stream
g++ -std=c++20 -O2 -o "$STREAM" "$ROOT/benchmarks/stream.cpp" || die "building stream failed"
PINGPONG=$WORK/pingpong
g++ -std=c++20 -O2 -o "$PINGPONG" "$ROOT/benchmarks/pingpong.cpp" || die "building pingpong failed"
if want java-echo; then
  javac -d "$WORK" "$ROOT/benchmarks/JavaEcho.java" || die "building JavaEcho failed"
fi
CASES=$((REPEAT * 2 * ${#ROWS[@]}))
CASE=0
for ((rep = 1; rep <= REPEAT; rep++)); do
  for path in tcp rsock; do
    for row in "${ROWS[@]}"; do
      CASE=$((CASE + 1))
      echo "bench-apps: case $CASE of $CASES ($((CASES - CASE)) left): $row over $path" \
        "(run $rep/$REPEAT)..." >&2
      EAGER=0
      [[ $row == *-eager ]] && EAGER=1
      case ${row%-eager} in
        redis-c1)
          run_redis "$path" 1 1 100000
          record "$row" "$path" SET.rps SET.p50 SET.p99 GET.rps GET.p50 GET.p99
          ;;
        redis-c50-P16)
          run_redis "$path" 50 16 1000000
          record "$row" "$path" SET.rps SET.p50 SET.p99 GET.rps GET.p50 GET.p99
          ;;
        memcached-c1)
          run_memcached "$path" 1
          record "$row" "$path" tps geo
          ;;
        memcached-c16)
          run_memcached "$path" 16
          record "$row" "$path" tps geo
          ;;
        nginx-wrk)
          run_nginx "$path"
          record "$row" "$path" rps p50 p99
          ;;
        nginx-ab)
          run_nginx "$path" ab
          record "$row" "$path" rps mean
          ;;
        java-echo)
          run_java "$path"
          record "$row" "$path" p50 p99
          ;;
        pingpong-sleep)
          run_pingpong "$path"
          record "$row" "$path" p50 p99 cpu
          ;;
        py-threaded)
          run_py "$path" 128 262144
          record "$row" "$path" mbs
          ;;
        py-threaded-1m)
          run_py "$path" 32 1048576
          record "$row" "$path" mbs
          ;;
        conns-10k)
          run_idle "$path" "$MANY" 1
          record "$row" "$path" cli.seconds cli.settled cli.fds cli.vm_kib cli.rss_kib srv.rss_kib
          ;;
        conns-block | conns-epoll)
          mode=${row#conns-}
          run_conns "$path" "${mode%-eager}"
          record "$row" "$path" rate p50 p99 cli_cpu srv_cpu
          ;;
        stream-*)
          run_stream "$path" "${row#stream-}"
          record "$row" "$path" mbs cpu
          ;;
        idle-conns)
          run_idle "$path" 1000 1048576 3000
          record "$row" "$path" cli.fds cli.vm_kib cli.rss_kib cli.idle_rss_kib cli.pinned_kib \
            srv.fds srv.vm_kib srv.rss_kib srv.idle_rss_kib srv.pinned_kib
          ;;
      esac
    done
  done
done

cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
read -r load1 _ </proc/loadavg
report=$WORK/apps.md
{
  echo "## Applications: librsock (shm) vs kernel TCP"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: nproc=$(nproc), ${cpu_model:-$(uname -m)}," \
    "kernel $(uname -r); load average at the end: $load1"
  echo "- server on cpu $CPU_SRV, load tool on cpu $CPU_CLI; $REPEAT runs per path, TCP and librsock" \
    "alternating; median (min-max); ratio: librsock/TCP for rates, TCP/librsock for latencies"
  echo "- $(redis-server --version | cut -d' ' -f1-3), memcached $(memcached -V | cut -d' ' -f2)," \
    "$(nginx -v 2>&1 | sed 's/.*: //'), $(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2)"
  echo
  echo "| row | metric | kernel TCP | librsock (shm) | ratio |"
  echo "|---|---|---:|---:|---:|"
  row_line() { # ROW METRIC LABEL KIND(rate|lat)
    local t r
    t=$(med_spread "${V[$1.$2.tcp]:-}") r=$(med_spread "${V[$1.$2.rsock]:-}")
    local rt
    if [[ $4 == rate ]]; then
      rt=$(ratio "$(median "${V[$1.$2.rsock]:-}")" "$(median "${V[$1.$2.tcp]:-}")")
    else
      rt=$(ratio "$(median "${V[$1.$2.tcp]:-}")" "$(median "${V[$1.$2.rsock]:-}")")
    fi
    [[ -n ${BAD[$1.rsock]:-} ]] && r="INVALID: $r" rt=n/a
    echo "| $1 | $3 | $t | $r | $rt |"
  }
  for row in "${ROWS[@]}"; do
    case $row in
      redis-*)
        for t in SET GET; do
          row_line "$row" "$t.rps" "$t requests/s" rate
          row_line "$row" "$t.p50" "$t p50 us" lat
          row_line "$row" "$t.p99" "$t p99 us" lat
        done
        ;;
      memcached-c1)
        row_line "$row" tps "ops/s (90% get)" rate
        row_line "$row" geo "geometric mean latency us" lat
        ;;
      memcached-c16) row_line "$row" tps "ops/s (90% get)" rate ;;
      nginx-wrk)
        row_line "$row" rps "requests/s" rate
        row_line "$row" p50 "p50 us" lat
        row_line "$row" p99 "p99 us" lat
        ;;
      nginx-ab*)
        row_line "$row" rps "requests/s, a connection each" rate
        row_line "$row" mean "mean us of a request" lat
        ;;
      java-echo)
        row_line "$row" p50 "p50 us of a 64-byte round trip" lat
        row_line "$row" p99 "p99 us of a 64-byte round trip" lat
        ;;
      pingpong-sleep)
        row_line "$row" p50 "p50 us of a 64-byte hop, spin off" lat
        row_line "$row" p99 "p99 us of a 64-byte hop, spin off" lat
        row_line "$row" cpu "client CPU us per round trip" lat
        ;;
      py-threaded | py-threaded-1m) row_line "$row" mbs "MB/s echoed to 8 threads" rate ;;
      idle-conns)
        row_line "$row" cli.fds "client fds per connection" lat
        row_line "$row" cli.vm_kib "client virtual KiB per connection" lat
        row_line "$row" cli.rss_kib "client resident KiB per connection, at once" lat
        row_line "$row" cli.idle_rss_kib "client resident KiB per connection, after 3 s idle" lat
        row_line "$row" cli.pinned_kib "client pinned KiB per connection" lat
        row_line "$row" srv.fds "server fds per connection" lat
        row_line "$row" srv.vm_kib "server virtual KiB per connection" lat
        row_line "$row" srv.rss_kib "server resident KiB per connection, at once" lat
        row_line "$row" srv.idle_rss_kib "server resident KiB per connection, after 3 s idle" lat
        row_line "$row" srv.pinned_kib "server pinned KiB per connection" lat
        ;;
      conns-10k)
        row_line "$row" cli.seconds "seconds to open $MANY (RLIMIT_NOFILE $NOFILE)" lat
        row_line "$row" cli.settled "seconds until the client's fds held still (all paired)" lat
        row_line "$row" cli.fds "client fds per connection" lat
        row_line "$row" cli.vm_kib "client virtual KiB per connection" lat
        row_line "$row" cli.rss_kib "client resident KiB per connection" lat
        row_line "$row" srv.rss_kib "server resident KiB per connection" lat
        ;;
      conns-*)
        row_line "$row" rate "connections/s" rate
        row_line "$row" p50 "p50 us of a connection" lat
        row_line "$row" p99 "p99 us of a connection" lat
        row_line "$row" cli_cpu "client CPU us per connection" lat
        row_line "$row" srv_cpu "server CPU us per connection" lat
        ;;
      stream-*)
        row_line "$row" mbs "MB/s received" rate
        row_line "$row" cpu "CPU ms per GB (both ends)" lat
        ;;
    esac
  done
  for k in "${!NOTES[@]}"; do echo "- $k: ${NOTES[$k]}"; done
  for k in "${!BAD[@]}"; do
    [[ $k == *.rsock ]] && echo "- **WARNING: $k: a librsock run was invalid (see the note above)**"
  done
} >"$report"
for k in "${!BAD[@]}"; do FAILED=1; done
# The numbers behind the table, for the plots (benchmarks/report.sh): each
# row's metric on each path, median, min and max of the runs, and whether
# every run of that path was valid.
{
  printf 'row\tmetric\tpath\tmedian\tmin\tmax\tvalid\n'
  # In the table's order of rows.
  for k in $(for row in "${ROWS[@]}"; do
    printf '%s\n' "${!V[@]}" | awk -v r="$row." 'index($0, r) == 1' | sort
  done); do
    line=$(spread "${V[$k]}")
    [[ -n $line ]] || continue
    row=${k%%.*} path=${k##*.}
    metric=${k#"$row".} metric=${metric%."$path"}
    valid=1
    [[ -n ${BAD[$row.$path]:-} ]] && valid=0
    printf '%s\t%s\t%s\t%s\t%s\n' "$row" "$metric" "$path" "$line" "$valid"
  done
} >"$WORK/apps.tsv"
mkdir -p "$OUT_DIR/data" && cp "$report" "$OUT_DIR/apps.md" && cp "$WORK/apps.tsv" "$OUT_DIR/data/apps.tsv"
cat "$report"
echo "bench-apps: table saved to $OUT_DIR/apps.md" >&2
exit "$FAILED"
