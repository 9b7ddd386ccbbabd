#!/usr/bin/env bash
# Application tier: unmodified sockperf, iperf3, iperf (2), and nginx
# (sendfile on, two workers) serving curl, with librsock preloaded into BOTH
# the server and the client over 127.0.0.1. Each case
# checks the tool's own result (message counts, JSON or CSV byte counts) AND
# the RSOCK_STATS line of each process: connections.shm >= 1 and no plain TCP
# stream (connections.tcp == 0) on both ends, and bytes moved through the
# shim in the expected direction(s).
#
# Output: one line per case, "PASS name" or "FAIL name: why", then the last
# line "N passed, N failed"; exit status 1 if any case failed. Failed cases'
# logs are kept (path on stderr). Every process runs under timeout; servers
# are found ready by polling `ss -ltn` and are stopped by pid (also from the
# EXIT trap). Runtime: about 50 s (APPS_SECONDS per run, default 2).
# Environment: BUILD (default build), APPS_SECONDS, APPS_ONLY (a regex of
# case names to run), RSOCK_LOG_LEVEL etc. are passed through to the shim.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LIB=$BUILD/librsock.so
T=${APPS_SECONDS:-2}
ONLY=${APPS_ONLY:-.}
WORK=$(mktemp -d /tmp/rsock-apps.XXXXXX)
SERVER_PID=""
PASSED=0
FAILED=0
KEEP=0

cleanup() {
  if [[ -n $SERVER_PID ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  fi
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
  command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || pkgs+=(nginx)
  command -v curl >/dev/null || pkgs+=(curl)
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

# start_server CASE PORT CMD...: the shim on, stats to $WORK/CASE.srv.stats.
start_server() {
  local name=$1 port=$2 i
  shift 2
  timeout --foreground -k 5 60 env LD_PRELOAD="$LIB" RSOCK_PEERS="127.0.0.1:$port" \
    RSOCK_STATS="$WORK/$name.srv.stats" "$@" >"$WORK/$name.srv.out" 2>&1 &
  SERVER_PID=$!
  for ((i = 0; i < 200; i++)); do
    [[ -n $(ss -ltnH "( sport = :$port )" 2>/dev/null) ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# run_client CASE PORT CMD...: returns the client's exit status.
run_client() {
  local name=$1 port=$2
  shift 2
  timeout --foreground -k 5 $((T + 30)) env LD_PRELOAD="$LIB" RSOCK_PEERS="127.0.0.1:$port" \
    RSOCK_STATS="$WORK/$name.cli.stats" "$@" >"$WORK/$name.cli.out" 2>&1
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

# Waits up to $1 s for the server to exit on its own, then sends SIGINT (the
# tools print their totals and exit, which writes the stats line), then
# SIGTERM after 5 s (timeout(1) forwards both; SIGKILL would orphan the tool).
stop_server() {
  local grace=${1:-0} i
  [[ -n $SERVER_PID ]] || return 0
  for ((i = 0; i < grace * 20; i++)); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.05
  done
  kill -INT "$SERVER_PID" 2>/dev/null
  for ((i = 0; i < 100; i++)); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.05
  done
  # timeout(1) forwards TERM to the server; KILL would orphan it. It runs
  # with --foreground everywhere: otherwise it also signals its whole process
  # group, the tool gets each signal twice, and iperf (2) takes a second
  # SIGINT as "_exit(0) now", which skips librsock's exit-time stats line.
  kill -0 "$SERVER_PID" 2>/dev/null && kill -TERM "$SERVER_PID"
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

# check_stats CASE PROGRAM: both ends paired over shm, none on plain TCP, and
# each end moved bytes. Sets STATS_WHY on failure; exports S_*/C_* values.
check_stats() {
  local name=$1 prog=$2 side f
  STATS_WHY="" S_SENT=0 S_RECV=0 C_SENT=0 C_RECV=0
  for side in srv cli; do
    f=$WORK/$name.$side.stats
    local shm tcp sent recv
    shm=$(stat_of "$f" "$prog" .connections.shm)
    tcp=$(stat_of "$f" "$prog" .connections.tcp)
    sent=$(stat_of "$f" "$prog" .bytes_sent)
    recv=$(stat_of "$f" "$prog" .bytes_received)
    if [[ -z $shm ]]; then
      STATS_WHY+="no $prog stats line from the $side; "
      continue
    fi
    ((shm >= 1)) || STATS_WHY+="$side connections.shm=$shm; "
    ((tcp == 0)) || STATS_WHY+="$side connections.tcp=$tcp (fallbacks: $(jq -c -s 'map(.fallbacks)' "$f")); "
    ((sent + recv > 0)) || STATS_WHY+="$side moved no bytes; "
    if [[ $side == srv ]]; then S_SENT=$sent S_RECV=$recv; else C_SENT=$sent C_RECV=$recv; fi
  done
  [[ -z $STATS_WHY ]]
}

report() {
  local name=$1 why=$2
  if [[ -z $why ]]; then
    echo "PASS $name"
    PASSED=$((PASSED + 1))
  else
    echo "FAIL $name: $why"
    FAILED=$((FAILED + 1))
    KEEP=1
    {
      echo "---- $name: server output (tail) ----"
      strip "$WORK/$name.srv.out" | tail -n 8
      echo "---- $name: client output (tail) ----"
      strip "$WORK/$name.cli.out" | tail -n 8
    } >&2
  fi
}

want() { [[ $1 =~ $ONLY ]]; }

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

iperf3_case() {
  local name=$1 reverse=$2 port why="" rc
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
  local -a client=(iperf3 -c 127.0.0.1 -p "$port" -t "$T" -J)
  ((reverse)) && client+=(-R)
  run_client "$name" "$port" "${client[@]}"
  rc=$?
  stop_server 5  # -1: the server exits after one test
  local out=$WORK/$name.cli.out err bytes
  err=$(jq -r '.error // empty' "$out" 2>/dev/null)
  bytes=$(jq -r '.end.sum_received.bytes // 0' "$out" 2>/dev/null)
  ((rc == 0)) || why+="client exit status $rc; "
  [[ -z $err ]] || why+="iperf3 error: $err; "
  [[ -n $bytes && $bytes =~ ^[0-9]+$ && $bytes -gt 0 ]] || why+="JSON end.sum_received.bytes=${bytes:-?}; "
  if check_stats "$name" iperf3; then
    # The data stream's receiver read at least what iperf3 counted.
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

# nginx as Debian configures it (sendfile on, tcp_nopush on) with two workers
# that share the listener, serving static files to curl. The bodies go out
# through sendfile(2): without its interception they would go into the
# kernel socket, which the client no longer reads. Every body is compared
# with its file; both ends' stats must show shm only. A private prefix,
# config and temp paths in $WORK: no system nginx service is involved.
nginx_case() {
  local name=nginx-sendfile port why="" rc f size i
  want "$name" || return 0
  local nginx_bin
  nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
  port=$(free_port) || {
    report "$name" "no free port"
    return
  }
  local prefix=$WORK/$name.nginx
  mkdir -p "$prefix/www" "$prefix/tmp" "$prefix/logs"
  # Sizes around the edges: a page, a ring (1 MiB), more than a ring, 10 MiB.
  local -a files=()
  for size in 1 4096 65537 1048576 3145735 10485760; do
    f=file_$size.bin
    head -c "$size" /dev/urandom >"$prefix/www/$f"
    files+=("$f")
  done
  # Workers run as this user (root in CI: otherwise nginx drops them to
  # nobody, who can read neither the files nor write the stats in $WORK).
  cat >"$prefix/nginx.conf" <<EOF
user $(id -un);
worker_processes 2;
daemon off;
master_process on;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 64; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 5;
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
  if ! start_server "$name" "$port" "$nginx_bin" -p "$prefix" -c "$prefix/nginx.conf" \
    -e "$prefix/logs/error.log"; then
    stop_server
    report "$name" "nginx did not listen on port $port (see $prefix/logs/error.log)"
    return
  fi
  # One connection per file, then all files over one kept-alive connection.
  rc=0
  for f in "${files[@]}"; do
    run_client "$name" "$port" curl -sS --max-time 30 -o "$WORK/$name.got.$f" \
      "http://127.0.0.1:$port/$f" || rc=$?
  done
  local -a keep=()
  for f in "${files[@]}"; do keep+=(-o "$WORK/$name.keep.$f" "http://127.0.0.1:$port/$f"); done
  run_client "$name" "$port" curl -sS --max-time 60 "${keep[@]}" || rc=$?
  ((rc == 0)) || why+="curl exit status $rc; "
  local want got kept
  for f in "${files[@]}"; do
    want=$(sha256sum <"$prefix/www/$f" | cut -d' ' -f1)
    got=$(cat "$WORK/$name.got.$f" 2>/dev/null | sha256sum | cut -d' ' -f1)
    kept=$(cat "$WORK/$name.keep.$f" 2>/dev/null | sha256sum | cut -d' ' -f1)
    [[ $got == "$want" ]] ||
      why+="$f: body differs ($(stat -c %s "$WORK/$name.got.$f" 2>/dev/null || echo 0) bytes); "
    [[ $kept == "$want" ]] || why+="$f (kept-alive): body differs; "
  done
  stop_server
  # Stats: every curl on shm; the nginx processes (master and workers)
  # accepted as many connections as curl made, all on shm, and sent at
  # least the bodies (each file twice) through librsock.
  local conns=$((${#files[@]} + 1)) srv_shm srv_tcp srv_sent cli_shm cli_tcp cli_lines total=0
  srv_shm=$(stat_of "$WORK/$name.srv.stats" nginx .connections.shm)
  srv_tcp=$(stat_of "$WORK/$name.srv.stats" nginx .connections.tcp)
  srv_sent=$(stat_of "$WORK/$name.srv.stats" nginx .bytes_sent)
  cli_shm=$(stat_of "$WORK/$name.cli.stats" curl .connections.shm)
  cli_tcp=$(stat_of "$WORK/$name.cli.stats" curl .connections.tcp)
  cli_lines=$(jq -s '[.[] | select(.program == "curl")] | length' "$WORK/$name.cli.stats" 2>/dev/null)
  for f in "${files[@]}"; do total=$((total + 2 * $(stat -c %s "$prefix/www/$f"))); done
  [[ ${srv_shm:-0} == "$conns" ]] || why+="nginx connections.shm=${srv_shm:-none}, expected $conns; "
  [[ ${srv_tcp:-x} == 0 ]] || why+="nginx connections.tcp=${srv_tcp:-none}; "
  [[ ${cli_lines:-0} == "$conns" ]] || why+="$conns curl stats lines expected, got ${cli_lines:-0}; "
  [[ ${cli_shm:-0} == "$conns" ]] || why+="curl connections.shm=${cli_shm:-none}, expected $conns; "
  [[ ${cli_tcp:-x} == 0 ]] || why+="curl connections.tcp=${cli_tcp:-none}; "
  ((${srv_sent:-0} >= total)) || why+="nginx bytes_sent=${srv_sent:-0} < bodies $total; "
  report "$name" "${why%; }"
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
iperf3_case iperf3 0
iperf3_case iperf3-reverse 1
iperf2_case iperf 0
iperf2_case iperf-reverse 1
nginx_case

((KEEP)) && echo "apps: logs of failed cases kept in $WORK" >&2
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
