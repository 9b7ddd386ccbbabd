#!/usr/bin/env bash
# guest.sh - the cases of the soft-RoCE tier, run inside BOTH guests of one
# test/rdma/vm.sh boot by test/rdma/run.sh (never run it directly).
#
# Host A (10.20.0.1) runs every server, host B (10.20.0.2) every client; each
# case function below holds both roles, chosen by $RSOCK_VM_HOST, and the two
# hosts move through the cases in lockstep with vm.sh's rsock_signal /
# rsock_wait (sync names "<case>.ready": A's server listens, "<case>.cli-done":
# B's clients ended). This script only runs things and records what happened;
# run.sh judges every case on the host afterwards. Per case it writes, into
# $TIER_RES/<case>/ (the repository is shared read-write at the same path):
#   <proc>.out / .err    the program's stdout / stderr
#   <proc>.rc            its exit status, or "timeout" when we had to kill it
#   <proc>.stats         RSOCK_STATS (every process gets the variable; only a
#                        preloaded one may write it)
#   <proc>.log           the shim's log (RSOCK_LOG_LEVEL=info) when preloaded
#   notes                harness remarks (e.g. a listener that never appeared)
# where <proc> is srv, cli (cli1, cli2 for the negative-cache case).
# Every wait is bounded and a process still running at its bound is killed,
# by pid, so one broken case costs at most a few minutes and never the run;
# the script always exits 0 (a non-zero status would make vm.sh kill the
# other guest). Inputs (exported by run.sh): TIER_RES, TIER_LIB, TIER_BIN
# (build/progs), TIER_ECHO, TIER_FORGE, TIER_CASES (the case names to run, in order),
# TIER_SECONDS (tool run time), TIER_CONNECT_TIMEOUT_MS, TIER_BYTES,
# TIER_MATRIX_BYTES, TIER_SMALL_BYTES, TIER_KILL_AFTER, TIER_MEMLOCK_LIMIT
# (bytes), TIER_LOSS_BOUND (s), TIER_FORKSRV (build/apps/forksrv),
# TIER_FORK_CONNS, TIER_FORK_BYTES, TIER_AB_REQUESTS, TIER_REDIS_C1,
# TIER_REDIS_C50 (redis-benchmark -n).

# SC2317: the case_* functions are called by name ("case_$CASE").
# shellcheck disable=SC2317
set -uo pipefail

HOST=$RSOCK_VM_HOST
SRV_IP=10.20.0.1 # host A
RS=$TIER_BIN/rs_stream
CASE=""
DIR=""
declare -A PID=()

note() { echo "$*" >> "$DIR/notes"; }

# env_for PROC PORT yes|no: sets ENVV, the `env ...` prefix of a process of
# this case, preloaded or not. Plain processes get the same settings (nothing
# reads them): a stats line from one would show that the shim ran. The rule
# names SRV_IP:PORT, or XPEERS when set.
env_for() {
  local proc=$1 port=$2 preload=$3
  ENVV=(env RSOCK_PEERS="${XPEERS:-$SRV_IP:$port}" RSOCK_STATS="$DIR/$proc.stats"
        RSOCK_CONNECT_TIMEOUT_MS="$TIER_CONNECT_TIMEOUT_MS")
  if [ "$preload" = yes ]; then
    ENVV+=(LD_PRELOAD="$TIER_LIB" RSOCK_LOG_LEVEL="${TIER_LOG_LEVEL:-info}" RSOCK_LOG_FILE="$DIR/$proc.log")
  else
    ENVV=(env -u LD_PRELOAD "${ENVV[@]:1}")
  fi
}

# start PROC CMD...: runs ENVV + CMD in the background; $! is the program
# itself (env execs it), so signals reach it and nothing else.
start() {
  local proc=$1
  shift
  "${ENVV[@]}" "$@" > "$DIR/$proc.out" 2> "$DIR/$proc.err" &
  PID[$proc]=$!
}

alive() { kill -0 "$1" 2> /dev/null; }

# finish PROC SECS [SYNC [GRACE]]: waits for PROC to exit, at most SECS, or
# GRACE s (default 20) more once the peer signalled SYNC; then SIGKILL.
# Records the status in PROC.rc.
finish() {
  local proc=$1 secs=$2 sync=${3:-} pid=${PID[$1]} i grace=-1 st
  for ((i = 0; i < secs * 10; i++)); do
    alive "$pid" || break
    if [ -n "$sync" ] && [ "$grace" -lt 0 ] && [ -e "$RSOCK_VM_SYNC/$sync" ]; then grace=$((${4:-20} * 10)); fi
    if [ "$grace" -ge 0 ]; then
      [ "$grace" -eq 0 ] && break
      grace=$((grace - 1))
    fi
    sleep 0.1
  done
  if alive "$pid"; then
    kill -KILL "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    echo timeout > "$DIR/$proc.rc"
    note "$proc (pid $pid) was still running after its bound and was killed"
    return
  fi
  wait "$pid" 2> /dev/null
  st=$?
  echo "$st" > "$DIR/$proc.rc"
}

tcp_listening() { [ -n "$(ss -Hltn "sport = :$1" 2> /dev/null)" ]; }
cm_listening() { rdma resource show cm_id 2> /dev/null | grep 'state LISTEN' | grep -Eq ":$1( |$)"; }

# ready PROC PORT yes|no: waits (bounded) until the server listens on TCP
# and, when preloaded, also on rdma_cm (a client arriving between the two
# would be rejected as "no listener"), then signals <case>.ready in any case.
ready() {
  local proc=$1 port=$2 preload=$3 i ok=0
  for ((i = 0; i < 600; i++)); do
    alive "${PID[$proc]}" || { note "$proc exited before listening"; break; }
    if tcp_listening "$port" && { [ "$preload" = no ] || cm_listening "$port"; }; then ok=1; break; fi
    sleep 0.1
  done
  [ "$ok" = 1 ] || note "$proc: no listener on port $port (TCP$([ "$preload" = yes ] && echo ' + rdma_cm'))"
  rsock_signal "$CASE.ready"
}

# B: waits for A's server; on failure the client still runs (and fails fast).
await_server() { rsock_wait "$CASE.ready" 240 || note "no '$CASE.ready' from host A"; }

# A: waits for B's clients before the next case (lockstep keeps one case at a time).
await_clients() { rsock_wait "$CASE.cli-done" 300 || note "no '$CASE.cli-done' from host B"; }

# A: waits (at most 120 s) until the running server srv has received
# TIER_KILL_AFTER bytes; true if it did and is still alive.
await_server_progress() {
  local i
  for ((i = 0; i < 1200; i++)); do
    grep -q '^PROGRESS rx' "$DIR/srv.out" 2> /dev/null && break
    alive "${PID[srv]}" || break
    [ -e "$RSOCK_VM_SYNC/$CASE.cli-done" ] && break
    sleep 0.1
  done
  grep -q '^PROGRESS rx' "$DIR/srv.out" 2> /dev/null && alive "${PID[srv]}"
}

# ---- cases --------------------------------------------------------------------

# An rs_stream exchange: BYTES each way at once, random write sizes and write
# APIs, mixed read APIs, every byte checked, EOF after the last one.
# exchange PORT SERVER_PRELOADED CLIENT_PRELOADED BYTES [CLIENT_OPTION...]
# (XADDR: the server's address, default SRV_IP; XPEERS: the rule, see env_for)
exchange() {
  local port=$1 spre=$2 cpre=$3 bytes=$4
  shift 4
  local common=(--addr "${XADDR:-$SRV_IP}" --port "$port" --send "$bytes" --expect "$bytes" --read-api mixed
                --write-api mixed --order "${XORDER:-duplex}" --shut-wr --expect-eof)
  if [ "$HOST" = A ]; then
    env_for srv "$port" "$spre"
    start srv "$RS" --role server "${common[@]}" --tx-seed 11 --rx-seed 12
    ready srv "$port" "$spre"
    finish srv 150 "$CASE.cli-done"
    await_clients
  else
    await_server
    env_for cli "$port" "$cpre"
    start cli "$RS" --role client "${common[@]}" --tx-seed 12 --rx-seed 11 "$@"
    finish cli 150
    rsock_signal "$CASE.cli-done"
  fi
}

case_integrity() { exchange 7501 yes yes "$TIER_BYTES"; }
# The integrity exchange over IPv6 (host A's fd00:20::1), rule in [addr]:port form.
case_ipv6() { XADDR=fd00:20::1 XPEERS="[fd00:20::1]:7503" exchange 7503 yes yes "$TIER_MATRIX_BYTES"; }
case_nonblocking-connect() { exchange 7502 yes yes "$TIER_MATRIX_BYTES" --nonblocking-connect; }
# Both ends send all of their bytes before reading any: more than both rings.
case_send-first() { XORDER=send-first exchange 7504 yes yes "$TIER_MATRIX_BYTES"; }
case_fallback-both-preloaded() { exchange 7511 yes yes "$TIER_MATRIX_BYTES"; }
case_fallback-client-preloaded() { exchange 7512 no yes "$TIER_MATRIX_BYTES"; }
case_fallback-server-preloaded() { exchange 7513 yes no "$TIER_MATRIX_BYTES"; }
case_fallback-neither-preloaded() { exchange 7514 no no "$TIER_MATRIX_BYTES"; }

# A preloaded server process takes two connections from the same plain client
# host, one after the other: the first waits for an rdma_cm request that never
# comes (peer_not_accelerated), the second must not wait (negative_cache).
# The data is echoed and checked by the client (equal seeds).
case_fallback-negative-cache() {
  local port=7515 n=$TIER_MATRIX_BYTES
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$TIER_ECHO" --addr "$SRV_IP" --port "$port" --count 2
    ready srv "$port" yes
    finish srv 150 "$CASE.cli-done"
    await_clients
  else
    await_server
    local c
    for c in cli1 cli2; do
      env_for "$c" "$port" no
      start "$c" "$RS" --role client --addr "$SRV_IP" --port "$port" --send "$n" --expect "$n" \
        --tx-seed 31 --rx-seed 31 --order duplex --shut-wr --expect-eof
      finish "$c" 90
    done
    rsock_signal "$CASE.cli-done"
  fi
}

# A listen-then-fork echo server (2 workers accepting 2 connections each from
# the inherited listener) and 4 clients at once, all preloaded (what it must
# show: run.sh's header). forked_workers PORT LISTEN_ADDR
forked_workers() {
  local port=$1 addr=$2 n=$TIER_SMALL_BYTES c
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$TIER_ECHO" --addr "$addr" --port "$port" --count 2 --workers 2
    ready srv "$port" yes
    finish srv 150 "$CASE.cli-done"
    await_clients
  else
    await_server
    for c in cli1 cli2 cli3 cli4; do
      env_for "$c" "$port" yes
      start "$c" "$RS" --role client --addr "$SRV_IP" --port "$port" --send "$n" --expect "$n" \
        --tx-seed 41 --rx-seed 41 --order duplex --shut-wr --expect-eof
    done
    for c in cli1 cli2 cli3 cli4; do finish "$c" 120; done
    rsock_signal "$CASE.cli-done"
  fi
}
# A wildcard listener: the parent opens no RDMA device.
case_forked-workers() { forked_workers 7516 0.0.0.0; }
# Listening on one address opens its RDMA device in the parent.
case_forked-workers-parent-rdma() { forked_workers 7517 "$SRV_IP"; }

# A neighbour of the client on host B sends a forged rdma_cm request naming
# the client's TCP connection (forge.cpp), before the server accepts (its
# gate opens once the forgery is out). Both requests wait in the server's
# listener; it may accept both, but must pair with the client's only: the
# forger cannot write the in-band proof. rs_echo, 256 KiB echoed and checked.
case_forged-request() {
  local port=7561 cport=7562
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    ENVV+=(RSOCK_CONNECT_TIMEOUT_MS=20000)
    start srv "$TIER_BIN/rs_echo" --role server --addr "$SRV_IP" --port "$port" --gate "$DIR/gate"
    ready srv "$port" yes
    rsock_wait "$CASE.forged" 120 || note "no '$CASE.forged' from host B"
    touch "$DIR/gate"
    finish srv 150 "$CASE.cli-done"
    await_clients
  else
    await_server
    local i
    env_for forge "$port" no
    start forge "$TIER_FORGE" "$SRV_IP" "$port" 10.20.0.2 "$cport"
    for ((i = 0; i < 300; i++)); do grep -q SENT "$DIR/forge.out" 2> /dev/null && break; sleep 0.1; done
    grep -q SENT "$DIR/forge.out" 2> /dev/null || note "the forger sent nothing"
    env_for cli "$port" yes
    ENVV+=(RSOCK_CONNECT_TIMEOUT_MS=20000)
    start cli "$TIER_BIN/rs_echo" --role client --addr "$SRV_IP" --port "$port" \
      --bind-port "$cport" --bytes "$TIER_SMALL_BYTES"
    # The client's connect() returns only once it paired: wait for its
    # kernel connection, then give its request a moment to go out.
    for ((i = 0; i < 300; i++)); do
      [ -n "$(ss -Htn state established "dport = :$port" 2> /dev/null)" ] && break
      sleep 0.1
    done
    sleep 1
    rsock_signal "$CASE.forged"
    finish cli 150
    finish forge 90
    rsock_signal "$CASE.cli-done"
  fi
}

# ---- connections that move to another process (rs_move) -------------------------
# The server side's process models (run.sh's header says what each must
# show); the clients are plain rs_stream echo clients, one after the other.
# move_server PORT NCLIENTS ARGS...: rs_move on A, NCLIENTS clients on B.
move_server() {
  local port=$1 ncli=$2 n=$TIER_MATRIX_BYTES c i
  shift 2
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$TIER_BIN/rs_move" --addr "$SRV_IP" --port "$port" "$@"
    ready srv "$port" yes
    finish srv 240 "$CASE.cli-done" 60
    await_clients
  else
    await_server
    for ((i = 1; i <= ncli; i++)); do
      c=cli$i
      env_for "$c" "$port" yes
      start "$c" "$RS" --role client --addr "$SRV_IP" --port "$port" --send "$n" --expect "$n" \
        --tx-seed $((70 + i)) --rx-seed $((70 + i)) --read-api mixed --write-api mixed \
        --order duplex --shut-wr --expect-eof
      finish "$c" 120
    done
    rsock_signal "$CASE.cli-done"
  fi
}
# Fork per connection, the parent closes at once, before the child's first
# call; the child closes and exits; three connections in a row.
case_fork-conn() { move_server 7581 3 --role fork --count 3 --close before --child-exit close; }
# The parent closes after the child's first call; the child exits without
# closing (exit: exit handlers run).
case_fork-conn-late() { move_server 7582 2 --role fork --count 2 --close after --child-exit exit; }
# The child leaves with _exit without closing (no exit handlers).
case_fork-conn-noclose() { move_server 7583 2 --role fork --count 2 --close before --child-exit _exit; }
# The parent exits right after it closed its copy: the child serves alone.
case_fork-conn-orphan() { move_server 7586 1 --role fork --count 1 --close before --child-exit close --parent-exit; }
# The parent exits without closing its copy (exit hands the end to the
# child, which still holds it); the child serves alone.
case_fork-conn-parent-exit() { move_server 7587 1 --role fork --count 1 --close never --child-exit close --parent-exit; }
# inetd: fork, the connection on stdin/stdout, closefrom(3), exec.
case_inetd() { move_server 7584 2 --role inetd --count 2; }

# Parent and child write records on one connection at once; the client
# checks every record and both sequences.
case_both-write() {
  local port=7585
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$TIER_BIN/rs_move" --role both-write --addr "$SRV_IP" --port "$port"
    ready srv "$port" yes
    finish srv 150 "$CASE.cli-done"
    await_clients
  else
    await_server
    env_for cli "$port" yes
    start cli "$TIER_BIN/rs_move" --role records --addr "$SRV_IP" --port "$port"
    finish cli 120
    rsock_signal "$CASE.cli-done"
  fi
}

# Unmodified sockperf, shim on both ends; the server is stopped with SIGINT
# once the client is done (it then prints its totals and writes its stats).
# Pairing under load (run.sh's header says what is judged): a server of
# WORKERS rs_pairstress workers on A (SHARE fork: one inherited wildcard
# listener, so each worker pairs through the client's rendezvous; reuseport:
# SO_REUSEPORT siblings, each with its own listener), CLIENTS client
# processes on B (odd ones blocking, even ones event-loop), CONNS
# connections each, PARALLEL at a time, every connection checked end to end
# by rs_pairstress. TIMEOUTS: pairing timeouts (ms) cycled over the server
# and the clients; empty: the tier's. Rings of 64 KiB keep the pinned
# memory of the guests small.
# pairing_stress PORT SHARE CLIENTS CONNS PARALLEL ROUNDS "TIMEOUTS"
pairing_stress() {
  local port=$1 share=$2 clients=$3 conns=$4 parallel=$5 rounds=$6 c io
  local -a timeouts
  read -ra timeouts <<< "$7"
  # The pairing timeout of process number $1 (the server is 0).
  timeout_of() {
    if [ ${#timeouts[@]} -gt 0 ]; then echo "${timeouts[$(($1 % ${#timeouts[@]}))]}"; else echo "$TIER_CONNECT_TIMEOUT_MS"; fi
  }
  cm_counters "$HOST.cm-before"
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    ENVV+=(RSOCK_RING_SIZE=64K RSOCK_CONNECT_TIMEOUT_MS="$(timeout_of 0)")
    start srv "$TIER_BIN/rs_pairstress" --role server --addr 0.0.0.0 --port "$port" --workers 2 \
      --share "$share" --io mixed --stop "$DIR/stop"
    ready srv "$port" yes
    await_clients
    touch "$DIR/stop"
    finish srv 120
  else
    await_server
    for ((c = 1; c <= clients; c++)); do
      env_for "cli$c" "$port" yes
      ENVV+=(RSOCK_RING_SIZE=64K RSOCK_CONNECT_TIMEOUT_MS="$(timeout_of "$c")")
      io=block
      [ $((c % 2)) = 0 ] && io=epoll
      start "cli$c" "$TIER_BIN/rs_pairstress" --role client --addr "$SRV_IP" --port "$port" \
        --id "$c" --conns "$conns" --parallel "$parallel" --io "$io" --rounds "$rounds" \
        --hold-ms 20 --bytes 8192
    done
    for ((c = 1; c <= clients; c++)); do finish "cli$c" 240; done
    rsock_signal "$CASE.cli-done"
  fi
  cm_counters "$HOST.cm-after"
}
# The IB CM's message counters of this host (sent, received, retries), for
# the record: a connection that one side tore down and the other never
# heard of shows as a message sent here and not received there.
cm_counters() {
  local d f
  for d in /sys/class/infiniband/"$RSOCK_VM_DEV"/ports/*/cm_* /sys/class/infiniband_cm/"$RSOCK_VM_DEV"/*/cm_*; do
    for f in "$d"/*; do [ -r "$f" ] && echo "${d##*/}/${f##*/} $(cat "$f")"; done
  done > "$DIR/$1" 2> /dev/null
}
case_pairing-stress() { pairing_stress 7571 fork 4 12 4 2 ""; }
case_pairing-stress-reuseport() { pairing_stress 7572 reuseport 4 12 4 2 ""; }
# 1-5 ms: every step of the handshake runs into a deadline somewhere. Each
# client process stops pairing after its first timeout (negative cache), so
# many processes with few connections each.
case_pairing-stress-tiny() { pairing_stress 7573 fork 12 4 4 1 "1 5 2 3 4 1"; }

# Two threads of the client on one rdma connection, each asleep in its own
# call (rs_sem's mt_* cases: a reader in recv, poll or epoll_wait, a writer
# in send, poll or epoll_wait on a full 64 KiB ring): each wakeup must reach
# the thread it is for, here completion events that one thread consumes
# for both (src/socket/wake_hub.h). rs_sem's control connection, on port + 1,
# stays on TCP.
threads_case() {
  local port=$1 which=$2
  local common=(--addr "$SRV_IP" --port "$port" --port2 "$((port + 1))")
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    ENVV+=(RSOCK_RING_SIZE=64K)
    start srv "$TIER_BIN/rs_sem" --role server "${common[@]}"
    ready srv "$port" yes
    finish srv 150 "$CASE.cli-done"
    await_clients
  else
    await_server
    env_for cli "$port" yes
    ENVV+=(RSOCK_RING_SIZE=64K)
    start cli "$TIER_BIN/rs_sem" --role client "${common[@]}" --case "$which"
    finish cli 150
    rsock_signal "$CASE.cli-done"
  fi
}
case_threads-recv-poll() { threads_case 7581 mt_poll; }
case_threads-recv-epoll() { threads_case 7583 mt_epoll; }
case_threads-poll-send() { threads_case 7585 mt_poll_send; }
case_threads-epoll-epoll() { threads_case 7587 mt_epoll_epoll; }
case_threads-epoll-dormant() { threads_case 7589 epoll_dormant; }

sockperf_case() {
  local port=$1 mode=$2
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv sockperf server --tcp -i "$SRV_IP" -p "$port"
    ready srv "$port" yes
    await_clients
    kill -INT "${PID[srv]}" 2> /dev/null
    finish srv 30
  else
    await_server
    env_for cli "$port" yes
    if [ "$mode" = pp ]; then
      start cli sockperf ping-pong --tcp -i "$SRV_IP" -p "$port" -m 64 -t "$TIER_SECONDS"
    else
      start cli sockperf throughput --tcp -i "$SRV_IP" -p "$port" -m 1400 -t "$TIER_SECONDS"
    fi
    finish cli $((TIER_SECONDS + 90))
    rsock_signal "$CASE.cli-done"
  fi
}
case_sockperf-pingpong() { sockperf_case 7521 pp; }
case_sockperf-throughput() { sockperf_case 7522 tp; }

# Unmodified iperf3 (control + data connection), shim on both ends; the server
# serves one test (-1) and exits.
case_iperf3() {
  local port=7523
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv iperf3 -s -1 -B "$SRV_IP" -p "$port" -J
    ready srv "$port" yes
    finish srv $((TIER_SECONDS + 120)) "$CASE.cli-done"
    await_clients
  else
    await_server
    env_for cli "$port" yes
    start cli iperf3 -c "$SRV_IP" -p "$port" -t "$TIER_SECONDS" -J
    finish cli $((TIER_SECONDS + 90))
    rsock_signal "$CASE.cli-done"
  fi
}

# Both ends stream without end; once the server has received TIER_KILL_AFTER
# bytes (1 MiB), host A SIGKILLs it. The client must end on its own (write
# error, EOF or reset); its bound (150 s) only turns a hang into a failure.
case_peer-killed() {
  local port=7531
  local common=(--addr "$SRV_IP" --port "$port" --send -1 --expect -1 --progress "$TIER_KILL_AFTER")
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$RS" --role server "${common[@]}" --tx-seed 41 --rx-seed 42
    ready srv "$port" yes
    if await_server_progress; then
      echo "peer-killed: SIGKILL to the server (pid ${PID[srv]}) mid-stream; bash reports it as 'Killed'"
      kill -KILL "${PID[srv]}"
      date +%s.%N > "$DIR/killed"
    else
      note "the server never reported $TIER_KILL_AFTER bytes received; not killed by the case"
    fi
    finish srv 30
    await_clients
  else
    await_server
    env_for cli "$port" yes
    start cli "$RS" --role client "${common[@]}" --tx-seed 42 --rx-seed 41
    finish cli 150
    date +%s.%N > "$DIR/cli.ended"
    rsock_signal "$CASE.cli-done"
  fi
}

# Bytes behind librsock: the client (writer) sends "hello", writes "RAW" on
# its socket with a raw syscall(SYS_sendto), then "bye"; the server (reader)
# reads. Over RDMA nothing may arrive on the TCP socket after the switch, so
# both ends must reset (rs_raw, run.sh's judge).
case_kernel-bytes() {
  local port=7561
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$TIER_BIN/rs_raw" --role reader --addr "$SRV_IP" --port "$port"
    ready srv "$port" yes
    finish srv 90 "$CASE.cli-done"
    await_clients
  else
    await_server
    env_for cli "$port" yes
    start cli "$TIER_BIN/rs_raw" --role writer --addr "$SRV_IP" --port "$port" --mode sendto
    finish cli 90
    rsock_signal "$CASE.cli-done"
  fi
}

# The pinned-memory bound: the preloaded client may pin only 64 KiB
# (RLIMIT_MEMLOCK, set with prlimit) and runs without CAP_IPC_LOCK (dropped
# with setpriv from every set: as root it would ignore the limit), so its
# rings cannot be registered and its bound turns the connection away
# (rdma_pinned_limit). It must go on over plain TCP; the
# preloaded server, which never gets the rdma_cm request, falls back after its
# bounded wait. cli.limits records what the client ran under (for the judge).
case_memlock() {
  local port=7541 n=$TIER_SMALL_BYTES
  local common=(--addr "$SRV_IP" --port "$port" --send "$n" --expect "$n" --read-api mixed
                --write-api mixed --order duplex --shut-wr --expect-eof)
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$RS" --role server "${common[@]}" --tx-seed 51 --rx-seed 52
    ready srv "$port" yes
    finish srv 150 "$CASE.cli-done"
    await_clients
  else
    await_server
    local limited=(prlimit --memlock="$TIER_MEMLOCK_LIMIT"
                   setpriv --inh-caps=-ipc_lock --ambient-caps=-ipc_lock --bounding-set=-ipc_lock)
    # shellcheck disable=SC2016 # expanded by the inner bash, under the limits
    "${limited[@]}" bash -c 'echo "memlock_kib=$(ulimit -l)"; grep "^Cap" /proc/self/status' \
      > "$DIR/cli.limits" 2>&1 || note "the limit/capability wrapper failed: $(tail -n 1 "$DIR/cli.limits")"
    env_for cli "$port" yes
    ENVV=("${limited[@]}" "${ENVV[@]}") # each execs the next: $! stays the program
    start cli "$RS" --role client "${common[@]}" --tx-seed 52 --rx-seed 51
    finish cli 150
    rsock_signal "$CASE.cli-done"
  fi
}

# Fork per connection (test/apps/forksrv.c, built by `make all`): the parent
# accepts on the wildcard address (it opens no RDMA device itself), forks a
# child per connection and closes its copy at once; the child echoes and
# exits. 10 connections from B, 2 at a time, 64 KiB each, echoed and checked.
case_fork-per-connection() {
  local port=7571
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$TIER_FORKSRV" server --addr 0.0.0.0 --port "$port" --count "$TIER_FORK_CONNS" --mode at-once
    ready srv "$port" yes
    finish srv 150 "$CASE.cli-done" 30
    await_clients
  else
    await_server
    env_for cli "$port" yes
    start cli "$TIER_FORKSRV" client --addr "$SRV_IP" --port "$port" --count "$TIER_FORK_CONNS" \
      --threads 2 --bytes "$TIER_FORK_BYTES"
    finish cli 150
    rsock_signal "$CASE.cli-done"
  fi
}

# nginx (Debian's, two workers, sendfile on, the wildcard listener of a
# default configuration) on A serving files to curl on B (one connection per
# file, then all over one kept-alive connection), then to ab (100 requests, 4
# at a time, a connection each). Files and the config live in the case's
# results directory, which both guests see.
case_nginx-workers() {
  local port=7572 prefix=$DIR/nginx f size
  if [ "$HOST" = A ]; then
    mkdir -p "$prefix/www" "$prefix/tmp" "$prefix/logs"
    for size in 1 65537 1048576 3145735; do head -c "$size" /dev/urandom > "$prefix/www/file_$size.bin"; done
    head -c 20000 /dev/urandom > "$prefix/www/page.bin"
    cat > "$prefix/nginx.conf" << EOF
user root;
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
  keepalive_timeout 30;
  default_type application/octet-stream;
  client_body_temp_path $prefix/tmp/body;
  proxy_temp_path $prefix/tmp/proxy;
  fastcgi_temp_path $prefix/tmp/fastcgi;
  uwsgi_temp_path $prefix/tmp/uwsgi;
  scgi_temp_path $prefix/tmp/scgi;
  server {
    listen $port;
    root $prefix/www;
  }
}
EOF
    env_for srv "$port" yes
    start srv nginx -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/logs/error.log"
    ready srv "$port" yes
    await_clients
    kill -QUIT "${PID[srv]}" 2> /dev/null
    finish srv 60
  else
    await_server
    local -a keep=()
    env_for cli "$port" yes
    for size in 1 65537 1048576 3145735; do
      f=file_$size.bin
      "${ENVV[@]}" curl -sS --max-time 60 -o "$DIR/got.$f" "http://$SRV_IP:$port/$f" >> "$DIR/cli.out" 2>&1 ||
        echo "curl $f: status $?" >> "$DIR/cli.out"
      keep+=(-o "$DIR/keep.$f" "http://$SRV_IP:$port/$f")
    done
    "${ENVV[@]}" curl -sS --max-time 90 "${keep[@]}" >> "$DIR/cli.out" 2>&1 ||
      echo "curl kept-alive: status $?" >> "$DIR/cli.out"
    start cli ab -q -n "$TIER_AB_REQUESTS" -c 4 "http://$SRV_IP:$port/page.bin"
    finish cli 150
    rsock_signal "$CASE.cli-done"
  fi
}

# redis-server on A (bound to its address), redis-cli and redis-benchmark on
# B: values of 1 B to 1 MiB set and read back, then redis-benchmark -c 1 and
# -c 50 -P 16 (SET and GET), the server's own command counts asked before
# and after (INFO commandstats).
case_redis() {
  local port=7573 size
  if [ "$HOST" = A ]; then
    mkdir -p "$DIR/redis"
    env_for srv "$port" yes
    start srv redis-server --port "$port" --bind "$SRV_IP" --save '' --appendonly no --dir "$DIR/redis" \
      --logfile '' --protected-mode no
    ready srv "$port" yes
    await_clients
    kill -TERM "${PID[srv]}" 2> /dev/null
    finish srv 60
  else
    await_server
    env_for cli "$port" yes
    local -a rc=(timeout -k 5 120 "${ENVV[@]}" redis-cli -h "$SRV_IP" -p "$port")
    for size in 1 4096 65537 1048576; do
      head -c "$size" /dev/urandom > "$DIR/val.$size"
      "${rc[@]}" -x SET "key:$size" < "$DIR/val.$size" > "$DIR/set.$size" 2>&1
      "${rc[@]}" --raw GET "key:$size" > "$DIR/get.$size" 2>&1
    done
    "${rc[@]}" INFO commandstats > "$DIR/info0" 2>&1
    timeout -k 5 150 "${ENVV[@]}" redis-benchmark -h "$SRV_IP" -p "$port" -c 1 -n "$TIER_REDIS_C1" \
      -t set,get --csv > "$DIR/bench-c1.out" 2>&1
    echo "$?" > "$DIR/bench-c1.rc"
    timeout -k 5 150 "${ENVV[@]}" redis-benchmark -h "$SRV_IP" -p "$port" -c 50 -P 16 -n "$TIER_REDIS_C50" \
      -t set,get --csv > "$DIR/bench-c50.out" 2>&1
    echo "$?" > "$DIR/bench-c50.rc"
    "${rc[@]}" INFO commandstats > "$DIR/info1" 2>&1
    rsock_signal "$CASE.cli-done"
  fi
}

# A vanished device (run LAST: it destroys host A's rxe0). Both ends stream
# without end; once the server has received TIER_KILL_AFTER bytes, host A
# deletes its rxe device (`rdma link delete rxe0`, which returns only once no
# process holds the device any more: rxe cannot disassociate user contexts).
# Both processes must end on their own, with an error or EOF, within
# TIER_LOSS_BOUND s of the removal (past it they are killed and the case
# fails). Records: removal.start / srv.ended / cli.ended (epoch s), and of the
# delete command removal.out, removal.rc, removal.end, and removal.after
# (`rdma link show` and the RDMA devices left afterwards).
case_device-lost() {
  local port=7551 i rm_pid=""
  local common=(--addr "$SRV_IP" --port "$port" --send -1 --expect -1 --progress "$TIER_KILL_AFTER")
  if [ "$HOST" = A ]; then
    env_for srv "$port" yes
    start srv "$RS" --role server "${common[@]}" --tx-seed 61 --rx-seed 62
    ready srv "$port" yes
    if await_server_progress; then
      echo "device-lost: deleting rxe0 under a running stream (server pid ${PID[srv]})"
      date +%s.%N > "$DIR/removal.start"
      rdma link delete rxe0 > "$DIR/removal.out" 2>&1 &
      rm_pid=$!
    else
      note "the server never reported $TIER_KILL_AFTER bytes received; the device was not removed"
    fi
    rsock_signal "$CASE.removed"
    finish srv "$TIER_LOSS_BOUND"
    date +%s.%N > "$DIR/srv.ended"
    if [ -n "$rm_pid" ]; then
      for ((i = 0; i < 300; i++)); do alive "$rm_pid" || break; sleep 0.1; done
      if alive "$rm_pid"; then
        note "rdma link delete rxe0 still blocked 30 s after the server ended"
      else
        wait "$rm_pid"
        echo $? > "$DIR/removal.rc"
        date +%s.%N > "$DIR/removal.end"
      fi
      { rdma link show; echo "rdma link show: status $?"; ls /sys/class/infiniband; } > "$DIR/removal.after" 2>&1
    fi
    await_clients
  else
    await_server
    env_for cli "$port" yes
    start cli "$RS" --role client "${common[@]}" --tx-seed 62 --rx-seed 61
    # The bound counts from the removal (host A's signal).
    finish cli $((TIER_LOSS_BOUND + 150)) "$CASE.removed" "$TIER_LOSS_BOUND"
    date +%s.%N > "$DIR/cli.ended"
    rsock_signal "$CASE.cli-done"
  fi
}

# ---- main ---------------------------------------------------------------------

for CASE in $TIER_CASES; do
  DIR=$TIER_RES/$CASE
  mkdir -p "$DIR"
  date +%s.%N > "$DIR/$HOST.start"
  "case_$CASE"
  date +%s.%N > "$DIR/$HOST.end"
done
exit 0
