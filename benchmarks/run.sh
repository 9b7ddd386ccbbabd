#!/usr/bin/env bash
# A/B benchmark of librsock against kernel TCP loopback, run by `make bench`.
#
# For each path (plain kernel TCP, then librsock preloaded into BOTH the
# sockperf server and client) it runs, with the server pinned to one core and
# the client to another:
#   - sockperf ping-pong, TCP, 64-byte messages -> p50 / p99 latency (us),
#     and the CPU time of both processes per round trip (us: their user +
#     system time over the whole run, warm-up included, over the round trips
#     measured; a spinning wait counts, it is CPU the host pays);
#   - sockperf throughput, TCP, 65000-byte messages -> MB/s as RECEIVED by the
#     server (`sockperf sr` message count x size / client run time); the
#     client's own number is a send rate and is printed next to it.
# librsock runs twice in each round: as users run it, and with RSOCK_PUBLISH=0
# (no file for rsockstat; its row shows what publishing costs, which should
# be nothing: the data path counts into that file as into its own memory).
# Every librsock run is checked through RSOCK_STATS: server and client must
# each report connections.shm >= 1, otherwise the result row is replaced by a
# loud warning and the script exits non-zero.
#
# Knobs (environment):
#   BENCH_SECONDS  seconds per measurement (sockperf -t; default 2)
#   BENCH_IOMUX    space-separated sockperf I/O modes to run: "default" (one
#                  socket, blocking recvfrom) and/or select|poll|epoll (via a
#                  feed file, -F on both ends). Default "default epoll".
#   BENCH_REPEAT   runs of each measurement, interleaved TCP/librsock; the table
#                  shows medians (default 3: this machine class is noisy)
#   BENCH_CPUS     two cpus "SERVER CLIENT" for taskset (default "0 1")
#   BENCH_RDMA     0: no RDMA comparison even where QEMU can run it
#   BUILD          build directory (default build)
# Then benchmarks/apps.sh adds the application rows (redis-benchmark,
# memcaslap against memcached, nginx + wrk; same alternation and medians;
# $BUILD/bench/apps.md), and benchmarks/rdma.sh the RDMA comparison when
# QEMU can run.
# The table goes to stdout and to $BUILD/bench/results.md, its numbers to
# $BUILD/bench/data/ (sockperf.tsv, percentiles.tsv), and at the end
# benchmarks/report.sh draws the plots ($BUILD/bench/plots/*.png) and
# writes $BUILD/bench/report.md, which embeds them above every table.
# Progress goes to stderr as "case K of N". Runtime: about
# (I/O modes) x REPEAT x 6 x (BENCH_SECONDS + 2.5) s (a sockperf client
# spends ~2.2 s besides -t), ~160 s with the defaults.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
SECONDS_PER_RUN=${BENCH_SECONDS:-2}
REPEAT=${BENCH_REPEAT:-3}
IOMUX_MODES=${BENCH_IOMUX:-default epoll}
read -r CPU_SRV CPU_CLI <<<"${BENCH_CPUS:-0 1}"
LIB=$BUILD/librsock.so
OUT_DIR=$BUILD/bench
PP_SIZE=64
# sockperf sizes its ping-pong sample array for ~600K messages/s unless told
# a rate, and aborts ("_seqN > m_maxSequenceNo") when librsock goes faster.
# A round trip over shm takes > 0.5 us, so this rate is hardly reached: it
# mostly sizes the array (32 B per message slot, ~150 MB virtual at 2 s,
# touched only as used).
PP_MPS=${BENCH_PP_MPS:-2000000}
TP_SIZE=65000  # sockperf rejects 64 KiB messages
WORK=$(mktemp -d /tmp/rsock-bench.XXXXXX)
SERVER_PID=""
RUN_SEQ=0

die() {
  echo "bench: $*" >&2
  exit 2
}

cleanup() {
  if [[ -n $SERVER_PID ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- tools ------------------------------------------------------------------

ensure_tools() {
  local -a pkgs=()
  command -v sockperf >/dev/null || pkgs+=(sockperf)
  command -v taskset >/dev/null || pkgs+=(util-linux)
  command -v ss >/dev/null || pkgs+=(iproute2)
  command -v timeout >/dev/null || pkgs+=(coreutils)
  command -v jq >/dev/null || pkgs+=(jq)
  [[ -x /usr/bin/time ]] || pkgs+=(time)
  # gnuplot draws the plots (benchmarks/report.sh): installed as root, else
  # the report goes without them and says why.
  if ! command -v gnuplot >/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then
      pkgs+=(gnuplot-nox)
    else
      echo "bench: gnuplot is not installed: no plots (apt-get install gnuplot-nox)" >&2
    fi
  fi
  ((${#pkgs[@]} == 0)) && return 0
  local install="apt-get install -y --no-install-recommends ${pkgs[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "bench: missing Debian packages: ${pkgs[*]}; install them with:" >&2
    echo "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive $install" >&2
    exit 2
  fi
  echo "bench: installing ${pkgs[*]}" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $install >&2 ||
    die "apt-get install ${pkgs[*]} failed"
}

# ---- processes and ports ------------------------------------------------------

# A TCP port that nothing listens on or uses, below the ephemeral range so
# that no client socket of a parallel run can take it meanwhile.
free_port() {
  local lo p i
  read -r lo _ </proc/sys/net/ipv4/ip_local_port_range
  ((lo > 12000)) || lo=32768
  for ((i = 0; i < 200; i++)); do
    p=$((10000 + RANDOM % (lo - 10000)))
    if [[ -z $(ss -tanH "( sport = :$p )" 2>/dev/null) ]]; then
      echo "$p"
      return 0
    fi
  done
  die "no free port found"
}

# Waits (up to 10 s) until pid listens on port; fails early if it died.
wait_listening() {
  local pid=$1 port=$2 i
  for ((i = 0; i < 200; i++)); do
    [[ -n $(ss -ltnH "( sport = :$port )" 2>/dev/null) ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# Waits (up to 5 s) until the server has no connection left on port: it has
# read the client's stream to its end and closed.
wait_drained() {
  local port=$1 i
  for ((i = 0; i < 100; i++)); do
    [[ -z $(ss -tanH "( sport = :$port )" 2>/dev/null | grep -v -E 'LISTEN|TIME-WAIT') ]] && return 0
    sleep 0.05
  done
  return 1
}

# Stops the current server with SIGINT (sockperf prints its totals and
# exits, which writes its stats line), escalating after 5 s.
stop_server() {
  local i
  [[ -n $SERVER_PID ]] || return 0
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

strip() { sed 's/\x1b\[[0-9;]*m//g' "$1"; }

# The CPU time (seconds) a live process has used so far: the scheduler's
# run time of its threads (/proc/PID/task/*/schedstat, nanoseconds), not
# /proc/PID/stat's ticks, which a process that runs in short bursts between
# sleeps can miss.
proc_cpu_s() {
  [[ -n $1 && -d /proc/$1/task ]] || return 0
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ns += $1} END {printf "%.6f", ns / 1e9}'
}

# Sums a field over the stats lines of the sockperf processes in a file.
stat_sum() {
  [[ -s $1 ]] || {
    echo 0
    return
  }
  jq -s "[.[] | select(.program == \"sockperf\") | $2] | add // 0" "$1" 2>/dev/null || echo 0
}

# ---- one measurement -----------------------------------------------------------

# run_case PATH MODE IOMUX -> sets R_* globals; PATH is tcp|rsock, MODE pp|tp.
run_case() {
  RUN_SEQ=$((RUN_SEQ + 1))
  local path=$1 mode=$2 iomux=$3 tag="$RUN_SEQ-$1-$2-$3" port
  port=$(free_port)
  local srv_out=$WORK/$tag.srv cli_out=$WORK/$tag.cli
  local srv_stats=$WORK/$tag.srv.stats cli_stats=$WORK/$tag.cli.stats
  local -a proto=(--tcp) addr=(-i 127.0.0.1 -p "$port") srv_env=(-u LD_PRELOAD) cli_env=(-u LD_PRELOAD)
  if [[ $iomux != default ]]; then
    # The feed file's "T:" line makes it TCP; -F picks the multiplexer.
    echo "T:127.0.0.1:$port" >"$WORK/$tag.feed"
    proto=() addr=(-f "$WORK/$tag.feed" -F "$iomux")
  fi
  if [[ $path == rsock* ]]; then
    local publish=1
    [[ $path == rsockoff ]] && publish=0
    srv_env=(LD_PRELOAD="$LIB" RSOCK_PEERS="127.0.0.1:$port" RSOCK_STATS="$srv_stats" "RSOCK_PUBLISH=$publish")
    cli_env=(LD_PRELOAD="$LIB" RSOCK_PEERS="127.0.0.1:$port" RSOCK_STATS="$cli_stats" "RSOCK_PUBLISH=$publish")
  fi
  local -a server=(sockperf server "${proto[@]}" "${addr[@]}")
  local -a client=(sockperf ping-pong "${proto[@]}" "${addr[@]}" -m "$PP_SIZE" --mps "$PP_MPS")
  [[ $mode == tp ]] && client=(sockperf throughput "${proto[@]}" "${addr[@]}" -m "$TP_SIZE")
  client+=(-t "$SECONDS_PER_RUN")

  R_OK=1 R_P50="" R_P99="" R_CPU_US="" R_RECV_MBS="" R_SEND_MBS="" R_NOTE="" R_PCT=""
  timeout --foreground -k 5 $((SECONDS_PER_RUN + 60)) taskset -c "$CPU_SRV" env "${srv_env[@]}" "${server[@]}" \
    >"$srv_out" 2>&1 &
  SERVER_PID=$!
  if ! wait_listening "$SERVER_PID" "$port"; then
    R_OK=0 R_NOTE="server did not listen on $port: $(strip "$srv_out" | tail -n 3 | tr '\n' ' ')"
    stop_server
    return
  fi
  # The client's CPU time from time(1), the server's from /proc before it
  # is stopped (timeout's child is the server itself: taskset and env exec).
  timeout --foreground -k 5 $((SECONDS_PER_RUN + 30)) /usr/bin/time -f '%U %S' -o "$cli_out.time" \
    taskset -c "$CPU_CLI" env "${cli_env[@]}" "${client[@]}" >"$cli_out" 2>&1
  local rc=$?
  wait_drained "$port" || R_NOTE="server still had a connection open; "
  local srv_cpu
  srv_cpu=$(proc_cpu_s "$(pgrep -P "$SERVER_PID" | head -n 1)")
  stop_server
  if ((rc != 0)); then
    R_OK=0 R_NOTE+="client exit $rc: $(strip "$cli_out" | tail -n 3 | tr '\n' ' ')"
    return
  fi

  if [[ $mode == pp ]]; then
    R_P50=$(strip "$cli_out" | sed -n 's/.*percentile 50\.000 = *\([0-9.]*\).*/\1/p' | tail -n 1)
    R_P99=$(strip "$cli_out" | sed -n 's/.*percentile 99\.000 = *\([0-9.]*\).*/\1/p' | tail -n 1)
    [[ -n $R_P50 && -n $R_P99 ]] || {
      R_OK=0
      R_NOTE+="no percentiles in sockperf output"
    }
    # Every percentile sockperf printed, "P=US ..." (for the plot).
    R_PCT=$(strip "$cli_out" | sed -n 's/.*percentile \([0-9.]*\) = *\([0-9.]*\).*/\1=\2/p' | tr '\n' ' ')
    # CPU per round trip, both ends: their CPU time over the whole run
    # (warm-up included) over the round trips of the measured period.
    local rounds cli_cpu
    rounds=$(strip "$cli_out" | sed -n 's/.*ReceivedMessages=\([0-9]*\).*/\1/p' | tail -n 1)
    cli_cpu=$(awk '{print $1 + $2}' "$cli_out.time" 2>/dev/null)
    if [[ -n $rounds && $rounds -gt 0 && -n $cli_cpu && -n $srv_cpu ]]; then
      R_CPU_US=$(awk -v a="$cli_cpu" -v b="$srv_cpu" -v n="$rounds" 'BEGIN{printf "%.2f", (a + b) * 1e6 / n}')
    fi
  else
    # Receiver side: what the server counted; sender side: the client's count.
    local sent secs recv
    sent=$(strip "$cli_out" | sed -n 's/.*Total of \([0-9]*\) messages sent in \([0-9.]*\) sec.*/\1/p')
    secs=$(strip "$cli_out" | sed -n 's/.*Total of \([0-9]*\) messages sent in \([0-9.]*\) sec.*/\2/p')
    recv=$(strip "$srv_out" | sed -n 's/.*Total \([0-9]*\) messages received.*/\1/p' | tail -n 1)
    if [[ -z $sent || -z $secs || -z $recv ]]; then
      R_OK=0 R_NOTE+="cannot read message counts (client sent='$sent' server received='$recv')"
    else
      R_RECV_MBS=$(awk -v n="$recv" -v m="$TP_SIZE" -v t="$secs" 'BEGIN{printf "%.1f", n*m/t/1e6}')
      R_SEND_MBS=$(awk -v n="$sent" -v m="$TP_SIZE" -v t="$secs" 'BEGIN{printf "%.1f", n*m/t/1e6}')
      ((recv < sent)) && R_NOTE+="server received $recv of $sent messages; "
      if [[ $path == rsock* ]]; then
        local got
        got=$(stat_sum "$srv_stats" .bytes_received)
        [[ $got == $((recv * TP_SIZE)) ]] ||
          R_NOTE+="librsock stats: server bytes_received=$got, sockperf count x size=$((recv * TP_SIZE)); "
      fi
    fi
  fi

  if [[ $path == rsock* ]]; then
    local s_shm c_shm
    s_shm=$(stat_sum "$srv_stats" .connections.shm)
    c_shm=$(stat_sum "$cli_stats" .connections.shm)
    if ((s_shm < 1 || c_shm < 1)); then
      R_OK=0 R_NOTE+="NOT OVER SHM: connections.shm server=$s_shm client=$c_shm "
      R_NOTE+="(server stats: $(cat "$srv_stats" 2>/dev/null | tr '\n' ' '))"
    fi
  fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2fx", a / b }'; }

# ---- main ------------------------------------------------------------------------

ensure_tools
[[ -f $LIB ]] || die "$LIB not found: run 'make' first"
nproc_n=$(nproc)
if ((nproc_n < 2)); then
  echo "bench: WARNING: only $nproc_n cpu; server and client share it" >&2
  CPU_SRV=0 CPU_CLI=0
fi
mkdir -p "$OUT_DIR"
# What an earlier run left must not pass for this one's (report.sh reads
# whatever is there).
rm -f "$OUT_DIR"/{results,apps,rdma,report}.md "$OUT_DIR"/data/*.tsv "$OUT_DIR"/plots/*.png

cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
[[ -n $cpu_model ]] || cpu_model=$(uname -m)
report=$WORK/results.md
read -r load1 _ </proc/loadavg
failed=0
{
  echo "# librsock vs kernel TCP (sockperf $(sockperf --version 2>&1 | sed -n 's/.*version \([^ ]*\).*/\1/p' | head -n 1))"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "- machine: nproc=$nproc_n, cpu: $cpu_model, kernel $(uname -r)"
  echo "- load average before the run: $load1 (1 min)"
  if awk -v l="$load1" 'BEGIN{exit !(l > 0.5)}'; then
    echo "- **WARNING: other processes were using the cpus (load $load1); numbers are noisy**"
  fi
  echo "- server pinned to cpu $CPU_SRV, client to cpu $CPU_CLI; ${SECONDS_PER_RUN} s per run;" \
    "ping-pong ${PP_SIZE} B, throughput ${TP_SIZE} B messages over TCP 127.0.0.1"
  echo "- librsock: LD_PRELOAD=$(basename "$LIB") on server and client, RSOCK_PEERS=127.0.0.1:<port>," \
    "shm use checked in RSOCK_STATS"
  echo "- CPU us per round trip: user + system time of server and client over the whole ping-pong" \
    "run (warm-up included), over the round trips measured"
  echo "- MB/s = 10^6 bytes/s RECEIVED by the server (sockperf sr message count x size / client" \
    "run time); 'sent MB/s' is the client's send rate"
} >"$report"

# spread NUMBERS...: "median<TAB>min<TAB>max" ("" if no number).
spread() {
  tr ' ' '\n' <<<"$*" | grep -E '^[0-9.]+$' | sort -g |
    awk '{v[NR]=$1} END{if (NR) printf "%.10g\t%.10g\t%.10g", (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2, v[1], v[NR]}'
}
# median FORMAT NUMBERS...: the median printed with FORMAT ("" if no number).
median() {
  local fmt=$1
  shift
  spread "$@" | awk -F'\t' -v f="$fmt" '{printf f, $1}'
}

# The data behind the plots (benchmarks/report.sh): medians with their
# spread, and each percentile's median.
DATA=$WORK/data
mkdir -p "$DATA"
printf 'iomux\tpath\tpercentile\tus\n' >"$DATA/percentiles.tsv"
printf 'iomux\tpath\tmetric\tmedian\tmin\tmax\n' >"$DATA/sockperf.tsv"

CASES=$(($(wc -w <<<"$IOMUX_MODES") * REPEAT * 3 * 2))
CASE=0
for iomux in $IOMUX_MODES; do
  declare -A V=()
  declare -A PCT=()
  for ((rep = 1; rep <= REPEAT; rep++)); do
    for path in tcp rsock rsockoff; do
      for mode in pp tp; do
        CASE=$((CASE + 1))
        echo "bench: case $CASE of $CASES ($((CASES - CASE)) left): $path $mode" \
          "(iomux $iomux, ${SECONDS_PER_RUN}s, run $rep/$REPEAT)..." >&2
        run_case "$path" "$mode" "$iomux"
        ((R_OK)) || { V[$path.$mode.bad]=1 failed=1; }
        [[ -n $R_NOTE ]] && V[$path.$mode.note]+="${R_NOTE% } "
        [[ $mode == pp ]] && V[$path.p50]+="$R_P50 " V[$path.p99]+="$R_P99 " V[$path.cpu]+="$R_CPU_US "
        [[ $mode == tp ]] && V[$path.mbs]+="$R_RECV_MBS " V[$path.sent]+="$R_SEND_MBS "
        if ((R_OK)); then
          for pv in $R_PCT; do PCT[$path ${pv%%=*}]+="${pv#*=} "; done
        fi
      done
    done
  done
  for k in "${!PCT[@]}"; do
    printf '%s\t%s\t%s\t%s\n' "$iomux" "${k% *}" "${k#* }" "$(spread "${PCT[$k]}" | cut -f1)"
  done | sort >>"$DATA/percentiles.tsv"
  for path in tcp rsock rsockoff; do
    for m in p50 p99 cpu mbs; do
      [[ -n ${V[$path.pp.bad]:-}${V[$path.tp.bad]:-} ]] && continue
      line=$(spread "${V[$path.$m]:-}")
      [[ -n $line ]] && printf '%s\t%s\t%s\t%s\n' "$iomux" "$path" "$m" "$line" >>"$DATA/sockperf.tsv"
    done
  done
  for k in {tcp,rsock,rsockoff}.{p50,p99,cpu,mbs,sent}; do
    ((REPEAT > 1)) && V[$k.all]=${V[$k]:-}
    fmt=%.3f
    [[ $k == *mbs || $k == *sent ]] && fmt=%.1f
    [[ $k == *cpu ]] && fmt=%.2f
    V[$k]=$(median "$fmt" "${V[$k]:-}")
  done
  {
    echo
    if [[ $iomux == default ]]; then
      echo "## sockperf default I/O (one socket, blocking recvfrom)"
    else
      echo "## sockperf --iomux-type $iomux (feed file, both ends)"
    fi
    echo
    echo "| path | p50 us | p99 us | CPU us per round trip | MB/s (received) | sent MB/s | p50 ratio (TCP/librsock) | MB/s ratio (librsock/TCP) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    echo "| TCP | ${V[tcp.p50]:-n/a} | ${V[tcp.p99]:-n/a} | ${V[tcp.cpu]:-n/a} | ${V[tcp.mbs]:-n/a} | ${V[tcp.sent]:-n/a} | 1.00x | 1.00x |"
    rs_ok=1
    [[ -n ${V[rsock.pp.bad]:-} || -n ${V[rsock.tp.bad]:-} ]] && rs_ok=0
    if ((rs_ok)); then
      echo "| librsock(shm) | ${V[rsock.p50]} | ${V[rsock.p99]} | ${V[rsock.cpu]:-n/a} | ${V[rsock.mbs]} | ${V[rsock.sent]} |" \
        "$(ratio "${V[tcp.p50]}" "${V[rsock.p50]}") | $(ratio "${V[rsock.mbs]}" "${V[tcp.mbs]}") |"
    else
      echo "| **WARNING: librsock(shm) RESULT INVALID** | ${V[rsock.p50]:-n/a} | ${V[rsock.p99]:-n/a} | ${V[rsock.cpu]:-n/a} |" \
        "${V[rsock.mbs]:-n/a} | ${V[rsock.sent]:-n/a} | n/a | n/a |"
    fi
    if [[ -z ${V[rsockoff.pp.bad]:-} && -z ${V[rsockoff.tp.bad]:-} ]]; then
      echo "| librsock(shm), RSOCK_PUBLISH=0 | ${V[rsockoff.p50]} | ${V[rsockoff.p99]} | ${V[rsockoff.cpu]:-n/a} |" \
        "${V[rsockoff.mbs]} | ${V[rsockoff.sent]} | $(ratio "${V[tcp.p50]}" "${V[rsockoff.p50]}") |" \
        "$(ratio "${V[rsockoff.mbs]}" "${V[tcp.mbs]}") |"
    else
      echo "| **WARNING: librsock(shm), RSOCK_PUBLISH=0 RESULT INVALID** | n/a | n/a | n/a | n/a | n/a | n/a | n/a |"
    fi
    for k in tcp.pp tcp.tp rsock.pp rsock.tp rsockoff.pp rsockoff.tp; do
      [[ -n ${V[$k.note]:-} ]] && echo "- ${k/./ }: ${V[$k.note]}"
    done
    if ((REPEAT > 1)); then
      echo "- medians of $REPEAT runs; all runs: TCP p50 ${V[tcp.p50.all]}/ CPU us ${V[tcp.cpu.all]}/" \
        "MB/s ${V[tcp.mbs.all]}; librsock p50 ${V[rsock.p50.all]}/ CPU us ${V[rsock.cpu.all]}/" \
        "MB/s ${V[rsock.mbs.all]}; RSOCK_PUBLISH=0 p50 ${V[rsockoff.p50.all]}/ CPU us" \
        "${V[rsockoff.cpu.all]}/ MB/s ${V[rsockoff.mbs.all]}"
    fi
    if ((rs_ok)) && [[ -n ${V[tcp.p50]} && -n ${V[tcp.mbs]} ]]; then
      lat=$(awk -v a="${V[tcp.p50]}" -v b="${V[rsock.p50]}" 'BEGIN{print (a >= 5 * b) ? "met" : "MISSED"}')
      thr=$(awk -v a="${V[rsock.mbs]}" -v b="${V[tcp.mbs]}" 'BEGIN{print (a >= 1.5 * b) ? "met" : "MISSED"}')
      echo "- targets: p50 latency >= 5x lower than TCP: $lat; throughput >= 1.5x TCP: $thr"
    fi
  } >>"$report"
  unset V PCT
done

mkdir -p "$OUT_DIR/data" && cp "$report" "$OUT_DIR/results.md"
cp "$DATA/percentiles.tsv" "$DATA/sockperf.tsv" "$OUT_DIR/data/"
cat "$report"
echo
echo "bench: table saved to $OUT_DIR/results.md" >&2
# Application rows (redis, memcached, nginx + wrk): benchmarks/apps.sh.
if [[ -f $ROOT/benchmarks/apps.sh ]]; then
  BUILD=$BUILD BENCH_REPEAT=$REPEAT bash "$ROOT/benchmarks/apps.sh" || failed=1
fi
[[ ${BENCH_RDMA:-1} != 0 && -f $ROOT/benchmarks/rdma.sh ]] && command -v qemu-system-x86_64 >/dev/null && { BUILD=$BUILD bash "$ROOT/benchmarks/rdma.sh"; rc=$?; ((rc == 0 || rc == 77)) || failed=1; } # RDMA side by side (exit 77: guests cannot run)
# The plots and report.md, from every table and data file this run saved.
bash "$ROOT/benchmarks/report.sh" "$OUT_DIR" || failed=1
if ((failed)); then
  echo "bench: WARNING: some runs failed or did not go over shm (see notes above)" >&2
  exit 1
fi
exit 0
