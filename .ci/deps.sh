#!/usr/bin/env bash
# Installs the Debian packages librsock needs to build and test, when they
# are missing. As root it runs apt-get itself; otherwise it prints the exact
# command and fails, so that nothing half-works.
#
# deps.sh build: only checks the packages a plain `make` needs, and when one
# is missing names them and the command that installs them, and fails
# (installs nothing).
set -euo pipefail

BUILD_PKGS=(g++ make libibverbs-dev librdmacm-dev)
if [ "${1:-}" = build ]; then
  command -v dpkg-query > /dev/null || exit 0  # not Debian: the compiler will say
  missing=()
  for p in "${BUILD_PKGS[@]}"; do
    dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && exit 0
  echo "librsock: cannot build: missing Debian packages: ${missing[*]}" >&2
  echo "  install them with: apt-get install -y --no-install-recommends ${missing[*]}" >&2
  echo "  (or, as root, make deps: every package the tests need too)" >&2
  exit 1
fi

PKGS=(g++ make pkg-config libibverbs-dev librdmacm-dev rdma-core ibverbs-providers
      libgtest-dev googletest libboost-dev sockperf iperf3 iperf iproute2 procps
      util-linux python3 jq nginx curl
      gnuplot-nox  # make bench's plots (benchmarks/report.sh, BenchReportTest)
      redis-server redis-tools memcached libmemcached-tools wrk apache2-utils  # the apps tier
      nodejs default-jdk-headless
      clang-14 libclang-rt-14-dev llvm-14  # the fuzz targets (test/fuzz): libFuzzer, ASan, symbolizer
      # gcc's sanitizer runtimes for make asan/ubsan/tsan (g++ pulls them in
      # already; named so that the dependency is explicit).
      libasan8 libubsan1 libtsan2)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" != 0 ]; then
  echo "librsock: missing Debian packages. Run as root:" >&2
  echo "  apt-get update && $cmd" >&2
  exit 1
fi
echo "librsock: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# iperf3 asks whether to start a daemon; the answer is no.
echo 'iperf3 iperf3/start_daemon boolean false' | debconf-set-selections 2>/dev/null || true
$cmd >&2 || { apt-get update >&2 && $cmd >&2; }
