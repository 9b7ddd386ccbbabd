#!/usr/bin/env bash
# librsock over RDMA side by side with rsocket and kernel TCP, between two
# emulated hosts with soft-RoCE (test/rdma/vm.sh); run by benchmarks/run.sh
# (`make bench`) when QEMU is there, or alone: bash benchmarks/rdma.sh
#
# One boot of the guest pair (A = 10.20.0.1 serves, B = 10.20.0.2 connects),
# and on the same rxe devices in the same run, for each tool over three paths
#   tcp      plain kernel TCP (no preload)
#   librsock LD_PRELOAD=librsock.so on both ends, RSOCK_PEERS=10.20.0.1:<port>,
#            RSOCK_CONNECT_TIMEOUT_MS=5000 unless set (emulated setup is slow);
#            valid only if RSOCK_STATS shows connections.rdma >= 1 on BOTH
#            ends (else the row says INVALID)
#   rsocket  LD_PRELOAD=librspreload.so (Debian's librdmacm1) on both ends;
#            its preload listens on rdma_cm only, so a completed run went
#            over rsocket
# the tools:
#   sockperf-pp  sockperf ping-pong, TCP, 64 B: p50/p99 (RTT/2, us)
#   sockperf-tp  sockperf throughput, TCP, 65000 B messages: MB/s = messages
#                the server received x size / client run time
#   iperf3       iperf3 -t 3: MB/s received (client's JSON end.sum_received)
#   iperf        iperf2 -t 3: MB/s received (server's CSV report)
#   pingpong     benchmarks/pingpong.cpp, 64 B: p50/p99 of RTT/2 (and the
#                client's CPU time per round trip, in the status)
#   stream       benchmarks/stream.cpp, 65000 B writes: MB/s the receiver saw
# (the last two use plain blocking socket calls only, so every path can run
# them). A run that fails is recorded as it happened: the row says FAILED
# with the tool's own error; rsocket is expected to fail the unmodified
# sockperf and iperf3. MB/s = 10^6 bytes/s. Soft-RoCE under TCG emulation is
# functional, not fast: the numbers compare paths, not NICs.
#
# The table (Markdown: tool, path, p50 us, p99 us, MB/s, status, then the
# librsock/rsocket ratios wherever both ran) goes to stdout and to
# $BUILD/bench/rdma.md; raw outputs stay in $BUILD/bench/rdma-run.XXXXXX/
# (the last finished run's is linked as $BUILD/bench/rdma-last;
# `bash benchmarks/rdma.sh --report` re-renders its table).
#
# Exit status: 0 every tcp and librsock run was valid (rsocket failures and
# missed goals are reported, not errors); 1 a tcp or librsock run failed or
# was INVALID, or the harness failed; 77 the guests cannot run here (printed
# loudly). Knobs (environment):
#   BENCH_RDMA_ROUNDS  rounds of every case, the table shows medians (default
#                      2; a case that failed in round 1 is not repeated)
#   BENCH_RDMA_SECONDS seconds per sockperf/iperf/stream run (default 3)
#   BENCH_RDMA_PP_ITERS  pingpong iterations (default 3000, +10% warm-up)
#   BENCH_RDMA_TOOLS   subset of the tools above (default all)
#   BUILD              build directory (default build)
#   RSOCK_VM_*         test/rdma/vm.sh's knobs (RSOCK_VM_SMP: vCPUs per guest)
# Runtime: about 20 s boot + rounds x 18 cases x ~5 s, ~4 minutes by default.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LIB=$BUILD/librsock.so
OUT=$BUILD/bench
# Each run has its own raw-output directory (runs may overlap: make bench in
# two shells); $OUT/rdma-last links to the last finished one.
RUN_DIR=${BENCH_RDMA_RUN_DIR:-$OUT/rdma-last}
ROUNDS=${BENCH_RDMA_ROUNDS:-2}
SECS=${BENCH_RDMA_SECONDS:-3}
PP_ITERS=${BENCH_RDMA_PP_ITERS:-3000}
TOOLS=${BENCH_RDMA_TOOLS:-sockperf-pp sockperf-tp iperf3 iperf pingpong stream}
PATHS="tcp librsock rsocket"
PP_SIZE=64
TP_SIZE=65000 # sockperf rejects 64 KiB messages
BASE_PORT=7700
CLI_GRACE=20 # a client gets SECS + this before timeout(1) ends it
SRV_IP=10.20.0.1
# Pairing over rdma_cm in emulated guests can take about a second (the
# default bound); this measures the data path, so give setup more room.
CONNECT_MS=${RSOCK_CONNECT_TIMEOUT_MS:-5000}
# rsocket's preload library, as Debian's librdmacm1 installs it.
rspreload_path() {
  dpkg -L librdmacm1 2> /dev/null | grep -m 1 '/librspreload\.so$' ||
    echo /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
}
RSPRELOAD=${BENCH_RDMA_RSPRELOAD:-$(rspreload_path)}

# Every case, in run order: "ID TOOL PATH PORT". Paths alternate within a
# tool so that drift in the emulation hits all three alike.
cases() {
  local i=0 t p
  for t in $TOOLS; do
    for p in $PATHS; do
      i=$((i + 1))
      echo "c$(printf %02d $i) $t $p $((BASE_PORT + i))"
    done
  done
}

# Server and client command lines of a case: sets SRV[] CLI[] STOP (the
# signal that ends the server, "" = it ends by itself after one client).
case_cmds() {
  local tool=$1 port=$2
  local pp=$BUILD/bench/pingpong st=$BUILD/bench/stream
  STOP=""
  case $tool in
    sockperf-pp)
      SRV=(sockperf server --tcp -i "$SRV_IP" -p "$port") STOP=INT
      CLI=(sockperf ping-pong --tcp -i "$SRV_IP" -p "$port" -m "$PP_SIZE" -t "$SECS")
      ;;
    sockperf-tp)
      SRV=(sockperf server --tcp -i "$SRV_IP" -p "$port") STOP=INT
      CLI=(sockperf throughput --tcp -i "$SRV_IP" -p "$port" -m "$TP_SIZE" -t "$SECS")
      ;;
    iperf3)
      SRV=(iperf3 -s -1 -B "$SRV_IP" -p "$port")
      CLI=(iperf3 -c "$SRV_IP" -p "$port" -t "$SECS" -J)
      ;;
    iperf)
      SRV=(iperf -s -B "$SRV_IP" -p "$port" -y C) STOP=INT
      CLI=(iperf -c "$SRV_IP" -p "$port" -t "$SECS" -y C)
      ;;
    pingpong)
      SRV=("$pp" server "$SRV_IP" "$port")
      CLI=("$pp" client "$SRV_IP" "$port" "$PP_SIZE" "$PP_ITERS" $((PP_ITERS / 10)))
      ;;
    stream)
      SRV=("$st" server "$SRV_IP" "$port")
      CLI=("$st" client "$SRV_IP" "$port" "$TP_SIZE" "$SECS")
      ;;
  esac
}

# The environment of one end: PATH-specific preload (argument 3: srv|cli).
path_env() {
  local path=$1 port=$2 side=$3 dir=$4
  case $path in
    tcp) ENV=(-u LD_PRELOAD) ;;
    librsock)
      ENV=(LD_PRELOAD="$LIB" RSOCK_PEERS="$SRV_IP:$port" RSOCK_STATS="$dir/$side.stats"
        RSOCK_CONNECT_TIMEOUT_MS="$CONNECT_MS")
      ;;
    rsocket) ENV=(LD_PRELOAD="$RSPRELOAD") ;;
  esac
}

# ============================================================== guest side ==
# Runs inside the guests (vm.sh gives rsock_signal/rsock_wait/rsock_listening
# and RSOCK_VM_HOST). A runs the servers, B the clients; the sync directory
# orders them: r<round>-<id>.up (A: server listening or given up), .failed and
# .done (B: client ended). B marks a case that failed in round 1 with
# fail-<id>; later rounds skip it on both sides.

guest_a() {
  local round id tool path port dir spid i pfx
  {
    echo "kernel=$(uname -r)"
    echo "vcpus=$(nproc)"
    echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
    echo "mem_mib=$(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo)"
    echo "active_mtu=$(ibv_devinfo -d rxe0 2> /dev/null | awk '/active_mtu/ {print $2; exit}')"
    echo "eth_mtu=$(cat /sys/class/net/eth0/mtu)"
  } > "$RUN_DIR/guest-A.info"
  for ((round = 1; round <= ROUNDS; round++)); do
    while read -r id tool path port; do
      pfx=r$round-$id
      [ "$round" -gt 1 ] && [ -e "$RSOCK_VM_SYNC/fail-$id" ] && continue
      dir=$RUN_DIR/$pfx
      mkdir -p "$dir"
      case_cmds "$tool" "$port"
      path_env "$path" "$port" srv "$dir"
      env "${ENV[@]}" "${SRV[@]}" > "$dir/srv.out" 2>&1 < /dev/null &
      spid=$!
      for ((i = 0; i < 300; i++)); do # 30 s: a cold server in TCG is slow
        rsock_listening "$port" && break
        kill -0 "$spid" 2> /dev/null || break
        sleep 0.1
      done
      rsock_listening "$port" || echo "server did not listen on $port" > "$dir/srv.note"
      rsock_signal "$pfx.up"
      rsock_wait "$pfx.done" $((SECS + 90)) || echo "no end of client seen" >> "$dir/srv.note"
      # A server that ends by itself gets a few seconds after a good client.
      if [ -z "$STOP" ] && [ ! -e "$RSOCK_VM_SYNC/$pfx.failed" ]; then
        for ((i = 0; i < 50; i++)); do kill -0 "$spid" 2> /dev/null || break; sleep 0.1; done
      fi
      kill -0 "$spid" 2> /dev/null && kill -"${STOP:-TERM}" "$spid" 2> /dev/null
      for ((i = 0; i < 50; i++)); do kill -0 "$spid" 2> /dev/null || break; sleep 0.1; done
      kill -0 "$spid" 2> /dev/null && { kill -KILL "$spid" 2> /dev/null; echo "server killed" >> "$dir/srv.note"; }
      wait "$spid"
      echo $? > "$dir/srv.rc"
      # Kernel TCP sockets on the port after the run (rsocket must have none).
      ss -tanH "( sport = :$port )" 2> /dev/null | grep -vc LISTEN > "$dir/srv.tcp" || true
      rsock_signal "$pfx.stopped"
    done <<< "$(cases)" # (no /dev/fd in the guests: no process substitution)
  done
}

guest_b() {
  local round id tool path port dir rc t0
  for ((round = 1; round <= ROUNDS; round++)); do
    while read -r id tool path port; do
      pfx=r$round-$id
      [ "$round" -gt 1 ] && [ -e "$RSOCK_VM_SYNC/fail-$id" ] && continue
      dir=$RUN_DIR/$pfx
      rsock_wait "$pfx.up" 120 || return 1
      case_cmds "$tool" "$port"
      path_env "$path" "$port" cli "$dir"
      echo "bench: round $round/$ROUNDS $tool over $path" >&2
      t0=$EPOCHREALTIME
      timeout -k 3 $((SECS + CLI_GRACE)) env "${ENV[@]}" "${CLI[@]}" > "$dir/cli.out" 2>&1 < /dev/null
      rc=$?
      echo "$rc" > "$dir/cli.rc"
      awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f\n", b - a}' > "$dir/cli.secs"
      if [ "$rc" != 0 ]; then
        rsock_signal "$pfx.failed"
        [ "$round" = 1 ] && rsock_signal "fail-$id"
      fi
      rsock_signal "$pfx.done"
      # Next case only once the server is gone (ports, CPU).
      rsock_wait "$pfx.stopped" 60 || return 1
    done <<< "$(cases)" # (no /dev/fd in the guests: no process substitution)
  done
}

if [ "${1:-}" = --guest ]; then
  export LC_ALL=C
  case ${RSOCK_VM_HOST:-} in
    A) guest_a ;;
    B) guest_b ;;
    *) echo "bench: --guest outside a vm.sh guest" >&2 && exit 2 ;;
  esac
  exit $?
fi

# =============================================================== host side ==

export LC_ALL=C
die() {
  echo "bench(rdma): $*" >&2
  exit 1
}

ensure_tools() {
  local -a pkgs=()
  command -v sockperf > /dev/null || pkgs+=(sockperf)
  command -v iperf3 > /dev/null || pkgs+=(iperf3)
  command -v iperf > /dev/null || pkgs+=(iperf)
  command -v jq > /dev/null || pkgs+=(jq)
  command -v g++ > /dev/null || pkgs+=(g++)
  [ -e "$RSPRELOAD" ] || pkgs+=(librdmacm1)
  ((${#pkgs[@]} == 0)) && return 0
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends)
  [ "$(id -u)" = 0 ] || die "missing Debian packages: ${pkgs[*]} (install them with apt-get)"
  echo "bench(rdma): installing ${pkgs[*]}" >&2
  "${apt[@]}" "${pkgs[@]}" >&2 || { apt-get update -qq >&2 && "${apt[@]}" "${pkgs[@]}" >&2; } ||
    die "apt-get install ${pkgs[*]} failed"
  RSPRELOAD=$(rspreload_path)
}

strip() { sed 's/\x1b\[[0-9;]*m//g' "$1" 2> /dev/null; }

# What a failed tool said, as one table-safe line: its first error line,
# else its last line.
excerpt() {
  local t
  t=$(strip "$1" | grep -v '^[[:space:]]*$' | grep -iE 'error|fail|refused|not supported|reset|broken|denied|timed out|unable' |
    head -n 1)
  [ -n "$t" ] || t=$(strip "$1" | grep -v '^[[:space:]]*$' | tail -n 1)
  tr '\n' ' ' <<< "$t" | tr -s ' \t' '  ' | sed 's/|/\\|/g; s/ $//' | cut -c1-200
}

stat_sum() { # FILE JQ-PATH: the field summed over the file's stats lines
  [ -s "$1" ] || {
    echo 0
    return
  }
  jq -s "[.[] | $2] | add // 0" "$1" 2> /dev/null || echo 0
}

# Parses one run directory: sets P50 P99 MBS (empty if none) OK NOTE.
parse_run() {
  local tool=$1 path=$2 port=$3 dir=$4 rc
  P50="" P99="" MBS="" CPU="" OK=0 NOTE=""
  if [ ! -e "$dir/cli.rc" ]; then
    NOTE="no result (the harness did not run it; see the vm.sh log)"
    return
  fi
  rc=$(cat "$dir/cli.rc")
  local err=""
  [ -s "$dir/srv.note" ] && err="server: $(tr '\n' ' ' < "$dir/srv.note")"
  case $tool in
    sockperf-pp)
      P50=$(strip "$dir/cli.out" | sed -n 's/.*percentile 50\.000 = *\([0-9.]*\).*/\1/p' | tail -n 1)
      P99=$(strip "$dir/cli.out" | sed -n 's/.*percentile 99\.000 = *\([0-9.]*\).*/\1/p' | tail -n 1)
      ;;
    sockperf-tp)
      local sent secs recv
      sent=$(strip "$dir/cli.out" | sed -n 's/.*Total of \([0-9]*\) messages sent in \([0-9.]*\) sec.*/\1/p' | tail -n 1)
      secs=$(strip "$dir/cli.out" | sed -n 's/.*Total of \([0-9]*\) messages sent in \([0-9.]*\) sec.*/\2/p' | tail -n 1)
      recv=$(strip "$dir/srv.out" | sed -n 's/.*Total \([0-9]*\) messages received.*/\1/p' | tail -n 1)
      if [ -n "$sent" ] && [ -n "$secs" ] && [ -n "$recv" ]; then
        MBS=$(awk -v n="$recv" -v m="$TP_SIZE" -v t="$secs" 'BEGIN {if (t > 0) printf "%.2f", n * m / t / 1e6}')
        ((recv < sent)) && NOTE="server received $recv of $sent messages"
      fi
      ;;
    iperf3)
      local e
      # Its JSON may repeat "error" (jq keeps the last): every distinct one.
      e=$(sed -n 's/^[[:space:]]*"error":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p' "$dir/cli.out" | awk '!seen[$0]++' |
        paste -sd';' | sed 's/;/; /g')
      [ -n "$e" ] && err="iperf3 errors: $e${err:+; $err}"
      MBS=$(jq -r '.end.sum_received.bits_per_second // empty' "$dir/cli.out" 2> /dev/null |
        awk '{printf "%.2f", $1 / 8e6}')
      ;;
    iperf)
      MBS=$(strip "$dir/srv.out" | awk -F, 'NF >= 9 && $9 ~ /^[0-9.]+$/ {v = $9} END {if (v != "") printf "%.2f", v / 8e6}')
      if [ -z "$MBS" ]; then # no receiver report: the client's (sender) rate
        MBS=$(strip "$dir/cli.out" | awk -F, 'NF >= 9 && $9 ~ /^[0-9.]+$/ {v = $9} END {if (v != "") printf "%.2f", v / 8e6}')
        [ -n "$MBS" ] && NOTE="MB/s from the client (no server report)"
      fi
      # iperf2 reports connect errors on stdout and still exits 0.
      if strip "$dir/cli.out" | grep -qiE 'failed|error|refused'; then
        [ "$rc" = 0 ] && rc=1
        MBS=""
      fi
      ;;
    pingpong)
      P50=$(sed -n 's/.*p50_us=\([0-9.]*\).*/\1/p' "$dir/cli.out" | tail -n 1)
      P99=$(sed -n 's/.*p99_us=\([0-9.]*\).*/\1/p' "$dir/cli.out" | tail -n 1)
      CPU=$(sed -n 's/.*cpu_us=\([0-9.]*\).*/\1/p' "$dir/cli.out" | tail -n 1)
      ;;
    stream)
      MBS=$(sed -n 's/.*received=.* MBps=\([0-9.]*\).*/\1/p' "$dir/srv.out" | tail -n 1)
      ;;
  esac
  local have=0
  case $tool in
    sockperf-pp | pingpong) [ -n "$P50" ] && [ -n "$P99" ] && have=1 ;;
    *) [ -n "$MBS" ] && have=1 ;;
  esac
  if [ "$rc" != 0 ] || [ "$have" = 0 ]; then
    local why="exit $rc"
    [ "$rc" = 124 ] && why="timed out after $((SECS + CLI_GRACE)) s, killed"
    [ "$rc" = 0 ] && why="no result in its output"
    local -a parts=()
    [ -n "$err" ] && parts+=("$err")
    # (iperf3's client output is JSON: its errors are in err already.)
    [ "$tool" = iperf3 ] && [ -n "$err" ] || parts+=("client: $(excerpt "$dir/cli.out")")
    [ -s "$dir/srv.out" ] && parts+=("server: $(excerpt "$dir/srv.out")")
    NOTE="FAILED ($why): ${parts[0]}"
    local k
    for ((k = 1; k < ${#parts[@]}; k++)); do NOTE+=" / ${parts[k]}"; done
    P50="" P99="" MBS=""
    return
  fi
  OK=1
  if [ "$path" = librsock ]; then
    local s c
    s=$(stat_sum "$dir/srv.stats" .connections.rdma)
    c=$(stat_sum "$dir/cli.stats" .connections.rdma)
    if ((s < 1 || c < 1)); then
      OK=0
      NOTE="INVALID: not over rdma (connections.rdma server=$s client=$c; fallbacks server"
      NOTE+=" $(jq -c -s '[.[].fallbacks] | add' "$dir/srv.stats" 2> /dev/null) client"
      NOTE+=" $(jq -c -s '[.[].fallbacks] | add' "$dir/cli.stats" 2> /dev/null))"
    fi
  fi
  if [ "$path" = rsocket ] && [ "$(cat "$dir/srv.tcp" 2> /dev/null || echo 0)" != 0 ]; then
    OK=0
    NOTE="INVALID: kernel TCP connections seen on the server port (not over rsocket)"
  fi
}

median() { # FORMAT NUMBERS...
  local fmt=$1
  shift
  tr ' ' '\n' <<< "$*" | grep -E '^[0-9.]+$' | sort -g |
    awk -v f="$fmt" '{v[NR] = $1} END {if (NR) printf f, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "" || b == "" || b + 0 == 0) print ""; else printf "%.2f", a / b}'; }

T_START=$SECONDS
read -r LOAD_BEFORE _ < /proc/loadavg
if [ "${1:-}" = --report ]; then # only re-render the table from the last run's raw outputs
  RUN_DIR=$(readlink -f "$RUN_DIR")
  [ -s "$RUN_DIR/vm.rc" ] || die "no previous run in $RUN_DIR"
  vm_rc=$(cat "$RUN_DIR/vm.rc")
  log=$RUN_DIR/vm.log
  ROUNDS=$(find "$RUN_DIR" -maxdepth 1 -name 'r*-c01' | wc -l)
else
  ensure_tools
  [ -f "$LIB" ] || die "$LIB not found: run 'make' first"
  mkdir -p "$OUT"
  for p in pingpong stream; do
    g++ -std=c++20 -O2 -Wall -Wextra -o "$OUT/$p" "$ROOT/benchmarks/$p.cpp" || die "building $p failed"
  done
  # Two benchmark pairs at once would share the two cores: wait for the other.
  OVERLAP=""
  exec 9> "$OUT/.rdma.lock"
  if ! flock -n 9; then
    echo "bench(rdma): another benchmarks/rdma.sh run is going on; waiting (up to 8 minutes)" >&2
    flock -w 480 9 || OVERLAP=1
  fi
  RUN_DIR=$(mktemp -d "$OUT/rdma-run.XXXXXX") || die "cannot create a run directory in $OUT"
  [ -n "$OVERLAP" ] && : > "$RUN_DIR/overlap"
  export BENCH_RDMA_RUN_DIR=$RUN_DIR # the guests' copy of this script writes there
  log=$RUN_DIR/vm.log
  echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC') $LOAD_BEFORE" > "$RUN_DIR/started"
  cd "$ROOT" || die "no $ROOT" # vm.sh shares the current directory with the guests
  case $BUILD/ in
    "$ROOT"/*) ;;
    *) export RSOCK_VM_RW=${RSOCK_VM_RW:+$RSOCK_VM_RW:}$BUILD ;; # the guests need it too
  esac
  # Bounds the whole pair (boot included) so that a run ends within 8 minutes.
  export RSOCK_VM_TIMEOUT=${RSOCK_VM_TIMEOUT:-420}
  export BUILD BENCH_RDMA_RSPRELOAD=$RSPRELOAD # the guests resolve nothing themselves
  echo "bench(rdma): $(cases | wc -l) cases x $ROUNDS rounds on two soft-RoCE guests (vm.sh)..." >&2
  bash "$ROOT/test/rdma/vm.sh" "bash benchmarks/rdma.sh --guest" "bash benchmarks/rdma.sh --guest" 2>&1 |
    tee "$log" | grep --line-buffered -E '^\[B\] bench:|rsock-vm:' >&2
  vm_rc=${PIPESTATUS[0]}
  echo "$vm_rc" > "$RUN_DIR/vm.rc"
fi
report=$RUN_DIR/rdma.md
# Publishes this run: the table to $OUT/rdma.md, the link to its raw outputs;
# the run the link pointed to before (finished, so unused) goes away.
publish() {
  [ "${1:-}" = --report ] && return 0
  local prev
  prev=$(readlink -f "$OUT/rdma-last" 2> /dev/null || true)
  cp "$report" "$OUT/rdma.md.$$" && mv -f "$OUT/rdma.md.$$" "$OUT/rdma.md"
  ln -sfn "$(basename "$RUN_DIR")" "$OUT/rdma-last.$$" && mv -Tf "$OUT/rdma-last.$$" "$OUT/rdma-last"
  case $prev in "$OUT"/rdma-run.?*) [ "$prev" != "$RUN_DIR" ] && rm -rf "$prev" ;; esac
}
if [ "$vm_rc" = 77 ]; then
  {
    echo "# librsock vs rsocket over soft-RoCE: SKIPPED"
    echo
    echo "The guests cannot run on this machine; vm.sh said:"
    echo
    grep -E 'rsock-vm: ' "$log" | sed 's/^/    /'
  } > "$report"
  publish "$@"
  echo "bench(rdma): ################################################################" >&2
  echo "bench(rdma): SKIPPED: the RDMA guests cannot run here (reason above)" >&2
  echo "bench(rdma): ################################################################" >&2
  exit 77
fi

accel=$(sed -n 's/.*; accel \([a-z]*\);.*/\1/p' "$log" | tail -n 1)
declare -A G=()
while IFS='=' read -r k v; do G[$k]=$v; done < "$RUN_DIR/guest-A.info" 2> /dev/null
cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
failed=0
declare -A R=()
{
  echo "# librsock vs rsocket vs kernel TCP over soft-RoCE (two emulated hosts)"
  echo
  read -r run_day run_time run_tz LOAD_BEFORE < "$RUN_DIR/started"
  echo "- date: $run_day $run_time $run_tz"
  echo "- host: nproc=$(nproc), cpu: ${cpu_model:-$(uname -m)}, kernel $(uname -r); load average" \
    "(1 min) $LOAD_BEFORE before, $(cut -d' ' -f1 /proc/loadavg) after the run"
  [ -e "$RUN_DIR/overlap" ] && echo "- **WARNING: another run of this benchmark overlapped this one: numbers are not valid**"
  if awk -v l="$LOAD_BEFORE" -v n="$(nproc)" 'BEGIN {exit !(l > n / 4)}'; then
    echo "- **WARNING: other processes were using the host cpus; the emulated guests share them: noisy numbers**"
  fi
  echo "- guests: accel ${accel:-unknown}$([ "$accel" = tcg ] && echo " (emulated CPU: speeds are functional, not a NIC's)")," \
    "${G[vcpus]:-?} vCPU and ${G[mem_mib]:-?} MiB each, kernel ${G[kernel]:-?}," \
    "rxe0 on virtio-net (eth MTU ${G[eth_mtu]:-?}, RoCE MTU ${G[active_mtu]:-?}), joined by QEMU -netdev dgram"
  echo "- server on A (10.20.0.1), client on B; ${SECS} s per sockperf/iperf/stream run, pingpong $PP_ITERS" \
    "iterations; ping-pong $PP_SIZE B, throughput $TP_SIZE B messages/writes; MB/s = 10^6 B/s received"
  echo "- librsock: LD_PRELOAD=librsock.so both ends, RSOCK_PEERS=10.20.0.1:<port>," \
    "RSOCK_CONNECT_TIMEOUT_MS=$CONNECT_MS, other knobs default (RSOCK_SPIN_US ${RSOCK_SPIN_US:-50}), rdma use checked in" \
    "RSOCK_STATS; rsocket: LD_PRELOAD=librspreload.so (librdmacm1 $(dpkg-query -W -f='${Version}' librdmacm1 2> /dev/null)) both ends"
  echo "- $ROUNDS round(s) of every case, interleaved; the table shows medians (a case that failed in round 1 is not repeated)"
  echo
  echo "| tool | path | p50 us | p99 us | MB/s | status |"
  echo "|---|---|---:|---:|---:|---|"
  while read -r id tool path port; do
    p50s="" p99s="" mbss="" cpus="" note="" nok=0 nrun=0
    for ((round = 1; round <= ROUNDS; round++)); do
      dir=$RUN_DIR/r$round-$id
      [ "$round" -gt 1 ] && [ ! -e "$dir" ] && continue # not repeated after a failure
      parse_run "$tool" "$path" "$port" "$dir"
      nrun=$((nrun + 1))
      if ((OK)); then
        nok=$((nok + 1))
        p50s+="$P50 " p99s+="$P99 " mbss+="$MBS " cpus+="$CPU "
        [ -n "$NOTE" ] && note+="${note:+; }$( ((ROUNDS > 1)) && echo "round $round: ")$NOTE"
      else
        note+="${note:+; }$( ((ROUNDS > 1)) && echo "round $round: ")$NOTE"
      fi
    done
    p50=$(median %.1f "$p50s") p99=$(median %.1f "$p99s") mbs=$(median %.2f "$mbss")
    R[$tool.$path.p50]=$p50 R[$tool.$path.mbs]=$mbs
    if ((nok == nrun && nrun > 0)); then
      R[$tool.$path.ok]=1
      if [ -n "${p50s// /}" ]; then per_run="p50 per run: $(xargs <<< "$p50s" | sed 's| | / |g')"; else
        per_run="MB/s per run: $(xargs <<< "$mbss" | sed 's| | / |g')"; fi
      ((nrun > 1)) && note+="${note:+; }$per_run"
      [ -n "${cpus// /}" ] && note+="${note:+; }client CPU $(median %.0f "$cpus") us per round trip"
      status="OK${note:+ ($note)}"
    else
      status=$note
      ((nok > 0)) && status="$nok of $nrun runs OK; $note" R[$tool.$path.ok]=1
      [ "$path" != rsocket ] && failed=1
    fi
    echo "| $tool | $path | ${p50:--} | ${p99:--} | ${mbs:--} | $status |"
  done < <(cases)
  echo
  echo "## librsock / rsocket (where both ran)"
  echo
  echo "Goal: librsock's p50 no higher (ratio <= 1) and its MB/s no lower (ratio >= 1) than rsocket's."
  echo
  echo "| tool | p50 librsock/rsocket | MB/s librsock/rsocket | librsock/TCP p50 | librsock/TCP MB/s | goal |"
  echo "|---|---:|---:|---:|---:|---|"
  for tool in $TOOLS; do
    if [ -z "${R[$tool.librsock.ok]:-}" ] || [ -z "${R[$tool.rsocket.ok]:-}" ]; then
      why="rsocket did not run"
      [ -z "${R[$tool.librsock.ok]:-}" ] && why="librsock did not run"
      echo "| $tool | - | - | - | - | n/a ($why) |"
      continue
    fi
    rp=$(ratio "${R[$tool.librsock.p50]}" "${R[$tool.rsocket.p50]}")
    rm_=$(ratio "${R[$tool.librsock.mbs]}" "${R[$tool.rsocket.mbs]}")
    tp=$(ratio "${R[$tool.librsock.p50]}" "${R[$tool.tcp.p50]:-}")
    tm=$(ratio "${R[$tool.librsock.mbs]}" "${R[$tool.tcp.mbs]:-}")
    goal=met
    [ -n "$rp" ] && awk -v r="$rp" 'BEGIN {exit !(r > 1)}' && goal="MISSED (latency)"
    [ -n "$rm_" ] && awk -v r="$rm_" 'BEGIN {exit !(r < 1)}' && goal="MISSED (throughput)"
    echo "| $tool | ${rp:--} | ${rm_:--} | ${tp:--} | ${tm:--} | $goal |"
  done
  echo
  echo "- total time of this benchmark: $((SECONDS - T_START)) s; vm.sh status $vm_rc"
} > "$report"
publish "$@"
cat "$report"
echo
echo "bench(rdma): table saved to $OUT/rdma.md (raw outputs in $RUN_DIR, linked as $OUT/rdma-last)" >&2
if [ "$vm_rc" != 0 ]; then
  echo "bench(rdma): WARNING: vm.sh exited with status $vm_rc (see $log)" >&2
  failed=1
fi
((failed)) && echo "bench(rdma): WARNING: some tcp or librsock runs failed or were INVALID" >&2
exit $((failed ? 1 : 0))
