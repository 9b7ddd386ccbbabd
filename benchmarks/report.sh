#!/usr/bin/env bash
# Plots and a Markdown report from what `make bench` measured, run by
# benchmarks/run.sh at its end, or alone on a finished run:
#
#   bash benchmarks/report.sh [BENCH_DIR]      (default $BUILD/bench)
#
# Reads the data files the benchmark scripts write beside their tables
# (tab-separated, one header line; numbers are medians of the runs, with
# their minimum and maximum):
#   data/percentiles.tsv  iomux path percentile us      (benchmarks/run.sh)
#   data/sockperf.tsv     iomux path metric median min max
#   data/apps.tsv         row metric path median min max valid
#                                                       (benchmarks/apps.sh)
# and writes, with gnuplot (Debian's gnuplot-nox):
#   plots/latency-percentiles.png  sockperf ping-pong latency by percentile,
#                                  TCP against librsock (default I/O, else
#                                  the first mode measured)
#   plots/throughput-by-size.png   MB/s of one stream by send size (the
#                                  stream-SIZE rows), with each path's spread
#   plots/conn-rate.png            connections/s (the conns-* rows)
#   plots/app-ratios.png           librsock against TCP on each application
#                                  row's headline number (above 1: librsock
#                                  is better, for rates and latencies alike)
#   report.md                      the plots and every table the run saved
#                                  (results.md, apps.md, rdma.md)
# A plot whose data this run did not measure (BENCH_APPS chose other rows)
# is left out and the report says so; so are all of them when gnuplot is
# missing (the report names the package). Exit status 0, or 2 when BENCH_DIR
# holds no data file at all (nothing was measured there) or a data file is
# malformed (its first bad line is named).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
DIR=${1:-$BUILD/bench}
DATA=$DIR/data
PLOTS=$DIR/plots
REPORT=$DIR/report.md

die() {
  echo "bench-report: $*" >&2
  exit 2
}

[[ -d $DIR ]] || die "$DIR: no such directory (run make bench first)"
have() { [[ -s $DATA/$1 ]]; }
have percentiles.tsv || have sockperf.tsv || have apps.tsv ||
  die "$DATA holds no data file (percentiles.tsv, sockperf.tsv, apps.tsv): run make bench first"

# check FILE FIELDS COLUMNS...: every line after the header has FIELDS
# tab-separated fields, and the given columns are numbers.
check() {
  local file=$1 fields=$2
  shift 2
  [[ -s $DATA/$file ]] || return 0
  local bad
  bad=$(awk -F'\t' -v n="$fields" -v cols="$*" '
    BEGIN { k = split(cols, c, " ") }
    NR == 1 { next }
    {
      if (NF != n) { print NR ": " NF " fields, not " n; exit }
      for (i = 1; i <= k; i++)
        if ($c[i] !~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/) { print NR ": field " c[i] " is not a number: " $c[i]; exit }
    }' "$DATA/$file")
  [[ -z $bad ]] || die "$DATA/$file line $bad"
}
check percentiles.tsv 4 4
check sockperf.tsv 6 4 5 6
check apps.tsv 7 4 5 6 7

mkdir -p "$PLOTS"
WORK=$(mktemp -d /tmp/rsock-bench-report.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

MADE=()     # "file|title" of each plot made
SKIPPED=()  # why a plot was not made

GNUPLOT=$(command -v gnuplot || true)
common() {
  cat <<'EOF'
set terminal pngcairo size 960,560 font ",11"
set datafile separator "\t"
set grid ytics lc rgb "#dddddd"
set key top left
set style line 1 lc rgb "#7f7f7f" lw 2 pt 7
set style line 2 lc rgb "#1f77b4" lw 2 pt 5
EOF
}

# plot NAME TITLE: runs the gnuplot script $WORK/NAME.gp, which writes
# $PLOTS/NAME.png; records the plot, or why it failed.
plot() {
  local name=$1 title=$2
  rm -f "$PLOTS/$name.png"
  if "$GNUPLOT" "$WORK/$name.gp" >"$WORK/$name.err" 2>&1 && [[ -s $PLOTS/$name.png ]]; then
    MADE+=("$name.png|$title")
  else
    SKIPPED+=("$name.png: gnuplot failed: $(head -n 3 "$WORK/$name.err" | tr '\n' ' ')")
  fi
}

# needs FILE WHY: whether FILE holds something; if not, the plot is left
# out for WHY ("NAME.png: the reason").
needs() {
  [[ -s $1 ]] && return 0
  SKIPPED+=("$2")
  return 1
}

# Latency by percentile: the rows of one I/O mode, a column per path.
latency_plot() {
  needs "$DATA/percentiles.tsv" "latency-percentiles.png: no sockperf ping-pong in this run" || return
  local mode
  mode=$(awk -F'\t' 'NR > 1 && $1 == "default" { print "default"; exit }' "$DATA/percentiles.tsv")
  [[ -n $mode ]] || mode=$(awk -F'\t' 'NR == 2 { print $1 }' "$DATA/percentiles.tsv")
  # percentile -> TCP, librsock; in percentile order.
  awk -F'\t' -v m="$mode" 'NR > 1 && $1 == m && ($2 == "tcp" || $2 == "rsock") {
      v[$3, $2] = $4; if (!($3 in seen)) { seen[$3] = 1; p[++n] = $3 } }
    END {
      for (i = 1; i <= n; i++) if ((p[i], "tcp") in v && (p[i], "rsock") in v)
        printf "p%s\t%s\t%s\n", p[i] + 0, v[p[i], "tcp"], v[p[i], "rsock"]
    }' "$DATA/percentiles.tsv" | sort -t p -k2 -g >"$WORK/lat.dat"
  needs "$WORK/lat.dat" "latency-percentiles.png: no percentile measured on both paths" || return
  {
    common
    echo "set output '$PLOTS/latency-percentiles.png'"
    echo "set title 'sockperf ping-pong, 64 B, sockperf I/O mode \"$mode\": one-way latency (RTT/2)'"
    echo "set ylabel 'microseconds (log scale)'"
    echo "set xlabel 'percentile'"
    echo "set logscale y"
    echo "plot '$WORK/lat.dat' using 0:2:xtic(1) with linespoints ls 1 title 'kernel TCP', \\"
    echo "     '' using 0:3 with linespoints ls 2 title 'librsock (shm)'"
  } >"$WORK/latency-percentiles.gp"
  plot latency-percentiles "Latency by percentile (sockperf ping-pong, I/O mode $mode)"
}

# apps_metric ROWGLOB METRIC: "row tcp tmin tmax rsock rmin rmax" for each
# row matching ROWGLOB (an awk regex) that has METRIC on both paths.
apps_metric() {
  awk -F'\t' -v re="$1" -v met="$2" 'NR > 1 && $1 ~ re && $2 == met {
      if (!($1 in seen)) { seen[$1] = 1; r[++n] = $1 }
      v[$1, $3] = $4 "\t" $5 "\t" $6 }
    END { for (i = 1; i <= n; i++) if ((r[i], "tcp") in v && (r[i], "rsock") in v)
      printf "%s\t%s\t%s\n", r[i], v[r[i], "tcp"], v[r[i], "rsock"] }' "$DATA/apps.tsv"
}

size_label() {
  awk -v b="$1" 'BEGIN { if (b >= 1048576 && b % 1048576 == 0) printf "%d MiB", b / 1048576;
    else if (b >= 1024 && b % 1024 == 0) printf "%d KiB", b / 1024; else printf "%d B", b }'
}

throughput_plot() {
  needs "$DATA/apps.tsv" "throughput-by-size.png: no application rows in this run" || return
  apps_metric '^stream-[0-9]+$' mbs | sed 's/^stream-//' | sort -g >"$WORK/size.raw"
  needs "$WORK/size.raw" "throughput-by-size.png: no stream-SIZE row in this run" || return
  local size rest
  while IFS=$'\t' read -r size rest; do
    printf '%s\t%s\n' "$(size_label "$size")" "$rest"
  done <"$WORK/size.raw" >"$WORK/size.dat"
  {
    common
    echo "set output '$PLOTS/throughput-by-size.png'"
    echo "set title 'One stream: MB/s received by send size (median, bars: min-max of the runs)'"
    echo "set ylabel 'MB/s (10^6 bytes/s, log scale)'"
    echo "set xlabel 'bytes per send'"
    echo "set logscale y"
    echo "set offsets 0.3, 0.3, 0, 0"
    echo "plot '$WORK/size.dat' using 0:2:3:4:xtic(1) with yerrorlines ls 1 title 'kernel TCP', \\"
    echo "     '' using 0:5:6:7 with yerrorlines ls 2 title 'librsock (shm)'"
  } >"$WORK/throughput-by-size.gp"
  plot throughput-by-size "Throughput of one stream by send size"
}

conn_plot() {
  needs "$DATA/apps.tsv" "conn-rate.png: no application rows in this run" || return
  apps_metric '^conns-(block|epoll)(-eager)?$' rate >"$WORK/conn.dat"
  needs "$WORK/conn.dat" "conn-rate.png: no conns-* row in this run" || return
  {
    common
    echo "set output '$PLOTS/conn-rate.png'"
    echo "set title 'Connections per second: connect, 1 byte each way, close (median, bars: min-max)'"
    echo "set ylabel 'connections/s'"
    echo "set yrange [0:*]"
    echo "set style data histogram"
    echo "set style histogram errorbars gap 1 lw 1"
    echo "set style fill solid 0.8 border -1"
    echo "set boxwidth 0.9"
    echo "set key top right"
    echo "plot '$WORK/conn.dat' using 2:3:4:xtic(1) lc rgb '#7f7f7f' title 'kernel TCP', \\"
    echo "     '' using 5:6:7 lc rgb '#1f77b4' title 'librsock (shm)'"
  } >"$WORK/conn-rate.gp"
  plot conn-rate "Connections per second"
}

# The headline number of each application row: its metric, and whether
# more is better (rate) or less (lat). The ratio is then librsock/TCP for a
# rate and TCP/librsock for a latency: above 1 is better for librsock.
headline() {
  case $1 in
    redis-*) echo "GET.rps rate" ;;
    memcached-*) echo "tps rate" ;;
    nginx-*) echo "rps rate" ;;
    java-echo | pingpong-sleep) echo "p50 lat" ;;
    py-threaded*) echo "mbs rate" ;;
    conns-10k) echo "cli.seconds lat" ;;
    conns-*) echo "rate rate" ;;
    stream-*) echo "mbs rate" ;;
    idle-conns) echo "cli.idle_rss_kib lat" ;;
  esac
}

# "row (metric)<TAB>ratio" for each application row measured validly on
# both paths, into $WORK/ratio.dat.
ratio_data() {
  local row metric kind
  : >"$WORK/ratio.dat"
  have apps.tsv || return 0
  while read -r row; do
    read -r metric kind <<<"$(headline "$row")"
    [[ -n ${metric:-} ]] || continue
    awk -F'\t' -v r="$row" -v m="$metric" -v k="$kind" 'NR > 1 && $1 == r && $2 == m {
        v[$3] = $4; ok[$3] = $7 }
      END {
        if (!("tcp" in v) || !("rsock" in v) || v["tcp"] + 0 == 0 || v["rsock"] + 0 == 0 || !ok["rsock"]) exit
        x = (k == "rate") ? v["rsock"] / v["tcp"] : v["tcp"] / v["rsock"]
        printf "%s (%s)\t%.4g\n", r, m, x
      }' "$DATA/apps.tsv" >>"$WORK/ratio.dat"
  done < <(awk -F'\t' 'NR > 1 && !seen[$1]++ { print $1 }' "$DATA/apps.tsv")
}

ratio_plot() {
  needs "$DATA/apps.tsv" "app-ratios.png: no application rows in this run" || return
  needs "$WORK/ratio.dat" "app-ratios.png: no application row measured validly on both paths" || return
  {
    common
    echo "set terminal pngcairo size 1200,640 font ',11'"
    echo "set output '$PLOTS/app-ratios.png'"
    echo "set title 'librsock against kernel TCP, each row''s headline number (above 1: librsock better)'"
    echo "set ylabel 'ratio (log scale)'"
    echo "set logscale y"
    # A bar from 1 to each ratio: up where librsock is better, down where not.
    echo "set style fill solid 0.8 border -1"
    echo "set xtics rotate by -40 left"
    echo "set bmargin 11"
    echo "set offsets 0.6, 0.6, 0, 0"
    echo "set key off"
    echo "plot '$WORK/ratio.dat' using 0:2:(\$0 - 0.35):(\$0 + 0.35):(1):2:xtic(1) with boxxyerror lc rgb '#1f77b4', \\"
    echo "     1 with lines lc rgb '#d62728' lw 2"
  } >"$WORK/app-ratios.gp"
  plot app-ratios "librsock against kernel TCP by application row"
}

ratio_data
if [[ -z $GNUPLOT ]]; then
  SKIPPED+=("every plot: gnuplot is not installed (apt-get install gnuplot-nox, or make deps)")
else
  latency_plot
  throughput_plot
  conn_plot
  ratio_plot
fi

{
  echo "# librsock benchmark report"
  echo
  echo "Made $(date -u '+%Y-%m-%d %H:%M UTC') from $(basename "$DIR")/ by benchmarks/report.sh."
  echo "Machine and method: see each table's header below."
  for m in "${MADE[@]}"; do
    echo
    echo "## ${m#*|}"
    echo
    echo "![${m#*|}](plots/${m%%|*})"
  done
  if [[ -s $WORK/ratio.dat ]]; then
    echo
    echo "Each application row's headline number, librsock against kernel TCP (medians;"
    echo "librsock/TCP for a rate, TCP/librsock for a latency or a cost: above 1, librsock is better):"
    echo
    echo "| row (metric) | ratio |"
    echo "|---|---:|"
    awk -F'\t' '{ printf "| %s | %.2fx |\n", $1, $2 }' "$WORK/ratio.dat"
  fi
  if ((${#SKIPPED[@]})); then
    echo
    echo "Plots left out:"
    echo
    for s in "${SKIPPED[@]}"; do echo "- $s"; done
  fi
  for t in results.md rdma.md apps.md; do
    [[ -s $DIR/$t ]] || continue
    echo
    # One level down: the report's title is the only first-level heading.
    sed 's/^#/##/' "$DIR/$t"
  done
} >"$REPORT"

for m in "${MADE[@]}"; do echo "bench-report: plot $PLOTS/${m%%|*}" >&2; done
for s in "${SKIPPED[@]}"; do echo "bench-report: left out $s" >&2; done
echo "bench-report: report saved to $REPORT" >&2
exit 0
