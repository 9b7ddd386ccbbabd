#!/usr/bin/env bash
# vm.sh - run two commands on two emulated hosts that talk real RDMA verbs.
#
# usage: test/rdma/vm.sh [-h] 'COMMAND ON HOST A' 'COMMAND ON HOST B'
#
# Why: the build machines have no RDMA NIC and their kernel has no RDMA stack,
# so each "host" is a throw-away QEMU guest booting Debian's own kernel
# (linux-image-amd64, fetched with apt-get download into a cache) with a busybox
# initramfs. The guest chroots into the HOST root filesystem mounted read-only
# over 9p (so it runs the host's binaries and libraries, including rdma-core),
# with the current directory mounted read-write at the same path. Each guest
# has one virtio-net NIC (eth0) carrying soft-RoCE (rxe0 = rdma_rxe on eth0);
# the two NICs are joined by QEMU's "-netdev dgram" over two 127.0.0.1 UDP
# ports, so A <-> B traffic crosses an emulated wire like between two machines.
#
#   host A: eth0 10.20.0.1/24, rxe0        host B: eth0 10.20.0.2/24, rxe0
#           eth0 fd00:20::1/64                      eth0 fd00:20::2/64
#
# Each COMMAND runs with `bash -c` in the current directory, with the caller's
# exported environment, and only after BOTH guests have eth0 + rxe0 up and
# have reached each other over IP (a barrier). Output is prefixed "[A] "/"[B] ".
#
# Available to the commands (exported variables):
#   RSOCK_VM=1  RSOCK_VM_HOST=A|B  RSOCK_VM_PEER=B|A  RSOCK_VM_IP  RSOCK_VM_PEER_IP
#   RSOCK_VM_IP6  RSOCK_VM_PEER_IP6 (IPv6, no DAD wait)
#   RSOCK_VM_DEV=rxe0  RSOCK_VM_NETDEV=eth0  RSOCK_VM_SYNC (dir shared by A and B)
# and exported shell functions (also usable from child bash scripts):
#   rsock_signal NAME            create $RSOCK_VM_SYNC/NAME
#   rsock_wait NAME [SECS]       wait (default 120 s) for NAME; fails at once if
#                                the peer's command has already ended
#   rsock_wait_listen PORT [SECS]  wait until a local TCP or rdma_cm listener is
#                                on PORT (use it instead of a fixed sleep: a cold
#                                server in an emulated guest is slow to start)
#   rsock_retry TRIES DELAY CMD...  run CMD until it succeeds, at most TRIES times
# Typical: a server on A listens, signals; the client on B waits, connects:
#   vm.sh 'srv 7000 & rsock_wait_listen 7000 && rsock_signal up; wait $!' \
#         'rsock_wait up && cli $RSOCK_VM_PEER_IP 7000'
#
# Exit status:
#   0    both commands succeeded
#   N    otherwise A's non-zero status, else B's
#   124  the run timed out (RSOCK_VM_TIMEOUT)
#   125  setup error (bad arguments, guest setup failed, a guest died without
#        reporting a status, e.g. a kernel panic)
#   77   skipped: this machine cannot run the guests (QEMU or packages missing
#        and not installable, kernel not downloadable, too little memory, QEMU
#        refused to start); the reason is printed loudly. RSOCK_VM_REQUIRE=1
#        turns a skip into 125.
#   2    usage
#
# Environment knobs:
#   RSOCK_VM_CACHE=DIR     kernel/initramfs/run cache (default ~/.cache/rsock-vm)
#   RSOCK_VM_ACCEL=auto|tcg|kvm  default auto: KVM only if a bounded probe boot
#                          reached the guest's init (verdict cached), else TCG
#   RSOCK_VM_KVM_PROBE_SECS=N    bound of that probe (default 10)
#   RSOCK_VM_TIMEOUT=SECS  kill both guests this long after they start (default
#                          600; a first run's kernel download is not counted)
#   RSOCK_VM_GRACE=SECS    after one command fails, the other guest gets this
#                          long before it is killed (default 15)
#   RSOCK_VM_MEM=MiB       memory per guest (default 1024)
#   RSOCK_VM_SMP=N         vCPUs per guest (default 1: two guests, two cores)
#   RSOCK_VM_MTU=N         eth0 MTU (default 1500 -> RoCE MTU 1024; >= 4500 -> 4096)
#   RSOCK_VM_RW=DIR:DIR    extra host directories mounted read-write
#   RSOCK_VM_KERNEL_PKG=linux-image-X-amd64  pin the kernel package
#   RSOCK_VM_REQUIRE=1     a skip (77) becomes a setup error (125)
#   RSOCK_VM_KEEP=1        keep the run directory (guest scripts, logs)
#   RSOCK_VM_VERBOSE=1     kernel messages, QEMU command lines, timings

# SC2317: the guest-side functions below run only inside the guests (copied
# there with declare -f). SC2054: commas inside QEMU option values are wanted.
# shellcheck disable=SC2317,SC2054
set -euo pipefail

readonly EX_SKIP=77 EX_TIMEOUT=124 EX_SETUP=125 EX_USAGE=2

CACHE=${RSOCK_VM_CACHE:-$HOME/.cache/rsock-vm}
ACCEL=${RSOCK_VM_ACCEL:-auto}
KVM_PROBE_SECS=${RSOCK_VM_KVM_PROBE_SECS:-10}
TIMEOUT=${RSOCK_VM_TIMEOUT:-600}
GRACE=${RSOCK_VM_GRACE:-15}
MEM=${RSOCK_VM_MEM:-1024}
SMP=${RSOCK_VM_SMP:-1}
MTU=${RSOCK_VM_MTU:-1500}
VERBOSE=${RSOCK_VM_VERBOSE:-0}

# Modules the guest needs: 9p for the root, virtio-net for the wire, rxe and
# the user-space verbs/rdma_cm interfaces. crc32_generic must be named: rxe
# needs a crc32 shash and `rdma link add` fails with ENOENT without it.
GUEST_MODULES="crc32_generic virtio_pci virtio_net 9pnet_virtio 9p rdma_rxe ib_uverbs rdma_ucm"
HOST_PACKAGES="qemu-system-x86 busybox-static kmod cpio rdma-core ibverbs-utils ibverbs-providers
               rdmacm-utils perftest iproute2"

LC_NUMERIC=C # $EPOCHREALTIME and awk must agree on the decimal point
T0=$EPOCHREALTIME
log()   { if [ "$VERBOSE" = 1 ]; then echo "rsock-vm: $*" >&2; fi; }
note()  { echo "rsock-vm: $*" >&2; }
since() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
die()   { echo "rsock-vm: ERROR: $*" >&2; exit "$EX_SETUP"; }
# A skip must be impossible to overlook in a CI log, hence the banner.
skip() {
  {
    echo "rsock-vm: ################################################################"
    echo "rsock-vm: SKIPPED - this machine cannot run the RDMA guests:"
    local l; while IFS= read -r l; do echo "rsock-vm:   $l"; done <<< "$*"
    echo "rsock-vm: ################################################################"
  } >&2
  if [ "${RSOCK_VM_REQUIRE:-0}" = 1 ]; then exit "$EX_SETUP"; fi
  exit "$EX_SKIP"
}

usage() { sed -n '2,/^$/{/^$/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; exit "$EX_USAGE"; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && usage
[ $# -eq 2 ] || usage
CMD_A=$1 CMD_B=$2
for v in TIMEOUT GRACE MEM SMP MTU KVM_PROBE_SECS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "RSOCK_VM_$v must be a number (got '${!v}')"
done
case $ACCEL in auto|tcg|kvm) ;; *) die "RSOCK_VM_ACCEL must be auto, tcg or kvm";; esac
CWD=$(pwd -P)
[ "$CWD" != / ] || die "run from a project directory, not / (it is mounted read-write)"

# ------------------------------------------------------------ host packages --
# The project's machines are rebuilt from scratch, so install what is missing.
ensure_packages() {
  local p missing=()
  command -v dpkg-query > /dev/null || {
    command -v qemu-system-x86_64 > /dev/null || skip "no qemu-system-x86_64 and no dpkg to install it"
    return 0
  }
  for p in $HOST_PACKAGES; do
    dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2> /dev/null | grep -q '^ii' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  note "installing missing host packages: ${missing[*]}"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends
             -o DPkg::Lock::Timeout=300) # a concurrent run may be installing too
  # A stale or empty package list is the usual cause of failure: update once.
  "${apt[@]}" "${missing[@]}" >&2 ||
    { apt-get update >&2 && "${apt[@]}" "${missing[@]}" >&2; } ||
    skip "apt-get install ${missing[*]} failed"
}
ensure_packages

QEMU=$(command -v qemu-system-x86_64) || skip "qemu-system-x86_64 not found after installing qemu-system-x86"
# -netdev dgram appeared in QEMU 7.2; 9p needs QEMU built with virtfs.
# (Outputs are captured first: with pipefail, `cmd | grep -q` can fail when
# grep exits early and cmd gets SIGPIPE.)
backends=$("$QEMU" -netdev help 2> /dev/null || true)
grep -qx dgram <<< "$backends" ||
  skip "$QEMU has no '-netdev dgram' backend (needs QEMU >= 7.2): $("$QEMU" --version | head -1)"
devices=$("$QEMU" -device help 2> /dev/null || true)
grep -q '"virtio-9p-pci"' <<< "$devices" || skip "$QEMU was built without 9p (virtfs)"
if [ ! -x /bin/busybox ] || [[ $(ldd /bin/busybox 2>&1 || true) != *"not a dynamic"* ]]; then
  skip "/bin/busybox is missing or not static (install busybox-static)"
fi
avail_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
[ "$avail_mib" -ge $((2 * MEM + 256)) ] ||
  skip "two guests need $((2 * MEM)) MiB + headroom, only $avail_mib MiB available (RSOCK_VM_MEM)"

# ------------------------------------------------------------------- kernel --
# Everything built here is cached and shared by concurrent runs; the lock keeps
# two first runs from building the same thing at once.
mkdir -p "$CACHE"
exec 8> "$CACHE/.lock"
flock 8

# linux-image-amd64 is a metapackage: its dependency names the real kernel.
resolve_kernel() {
  apt-cache depends linux-image-amd64 2> /dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
KPKG=${RSOCK_VM_KERNEL_PKG:-$(cat "$CACHE/kernel-package" 2> /dev/null || true)}
if [ -z "$KPKG" ]; then
  KPKG=$(resolve_kernel)
  if [ -z "$KPKG" ]; then apt-get update >&2 || true; KPKG=$(resolve_kernel); fi
  [ -n "$KPKG" ] || skip "cannot resolve linux-image-amd64 with apt-cache (no Debian package lists?)"
  echo "$KPKG" > "$CACHE/kernel-package"
fi
download_kernel() { # $1 = package; unpacks boot/ and lib/modules/ into the cache
  local dir=$CACHE/kernel-${1#linux-image-} dl
  rm -rf "$dir"
  mkdir -p "$dir"
  # apt downloads as the _apt user: use a directory it can reach (a cache under
  # /root cannot be), else apt warns and downloads unsandboxed.
  dl=$(mktemp -d "${TMPDIR:-/tmp}/rsock-vm-kernel.XXXXXX")
  if [ "$(id -u)" = 0 ] && id _apt > /dev/null 2>&1; then chown _apt "$dl"; fi
  (cd "$dl" && apt-get download "$1" >&2) || { rm -rf "$dir" "$dl"; return 1; }
  # Only the kernel image and the modules are needed, not the rest of the .deb.
  dpkg-deb --fsys-tarfile "$dl"/*.deb | tar -x -C "$dir" ./boot ./lib/modules || die "unpacking $1 failed"
  # The .deb ships no modules.dep (its postinst makes it); make our own.
  depmod -b "$dir" "${1#linux-image-}" || die "depmod for $1 failed"
  rm -rf "$dl"
  touch "$dir/.complete"
}
if [ ! -e "$CACHE/kernel-${KPKG#linux-image-}/.complete" ]; then
  note "downloading $KPKG (one-time, about 70 MB)"
  if ! download_kernel "$KPKG"; then
    # Stale package lists name a version the archive has dropped (security
    # updates replace kernels): refresh, re-resolve unless pinned, retry once.
    note "download failed; refreshing the package lists and retrying"
    apt-get update >&2 || true
    if [ -z "${RSOCK_VM_KERNEL_PKG:-}" ]; then
      KPKG=$(resolve_kernel)
      [ -n "$KPKG" ] || skip "cannot resolve linux-image-amd64 with apt-cache"
      echo "$KPKG" > "$CACHE/kernel-package"
    fi
    download_kernel "$KPKG" || skip "apt-get download $KPKG failed (no access to the Debian archive?)"
  fi
fi
KVER=${KPKG#linux-image-}
KDIR=$CACHE/kernel-$KVER

# Under TCG, booting the uncompressed ELF through its PVH entry point (QEMU's
# -kernel supports it) skips the real-mode setup and the in-guest XZ
# decompression, about a second per boot. Fall back to the bzImage otherwise.
BZIMAGE=$KDIR/boot/vmlinuz-$KVER
ELF=$KDIR/vmlinux
if [ ! -e "$ELF.checked" ]; then
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$BZIMAGE" 2> /dev/null | head -1 | cut -d: -f1 || true)
  if [ -n "$off" ] && xz -dc --single-stream < <(tail -c +$((off + 1)) "$BZIMAGE") > "$ELF.tmp" 2> /dev/null &&
    [ "$(head -c 4 "$ELF.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] &&
    [[ $(readelf -n "$ELF.tmp" 2> /dev/null || true) == *Xen* ]]; then # the PVH entry is a Xen ELF note
    mv "$ELF.tmp" "$ELF"
  else
    rm -f "$ELF.tmp" "$ELF"
  fi
  touch "$ELF.checked"
fi
KERNEL=$BZIMAGE
[ -s "$ELF" ] && KERNEL=$ELF

# ---------------------------------------------------------------- initramfs --
# busybox + the modules (in dependency order) + /init. /init loads the modules,
# mounts the host root and the run directory, then hands over to guest.sh (a
# bash script written per run, below) inside a chroot of the host root.
INIT_SCRIPT=$(cat << 'EOF'
#!/bin/sh
# PID 1 of an rsock-vm guest (busybox sh).
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# isa-debug-exit at port 0xf4 ends QEMU at once, without an ACPI shutdown.
leave() { sync; printf '\000' | dd of=/dev/port bs=1 seek=244 count=1 2> /dev/null; poweroff -f; }
fail() { echo "rsock-vm init: $*"; leave; }
for m in $(cat /modules/order); do insmod "/modules/$m" || echo "rsock-vm init: insmod $m failed"; done
case " $(cat /proc/cmdline) " in
  *" rsock.probe=1 "*) echo "RSOCK-VM-PROBE-OK"; leave ;;
esac
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /newroot ||
  fail "cannot mount the host root over 9p"
# The host root is read-only: /run becomes a tmpfs to hold the run directory.
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "tmpfs on /run"
mkdir -p /newroot/run/rsock-vm
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 run /newroot/run/rsock-vm ||
  fail "cannot mount the run directory over 9p"
chroot /newroot /bin/bash /run/rsock-vm/guest.sh < /dev/null > /dev/console 2>&1
leave
EOF
)
# The cached image is named after everything that goes into it.
INITRD=$CACHE/initramfs-$KVER-$(printf '%s\n' "$INIT_SCRIPT" "$GUEST_MODULES" | md5sum | cut -c1-10).cpio.gz
if [ ! -e "$INITRD" ]; then
  log "building $INITRD"
  tree=$(mktemp -d "$CACHE/initramfs.XXXXXX")
  mkdir -p "$tree"/{bin,dev,proc,sys,modules,newroot}
  cp /bin/busybox "$tree/bin/busybox"
  for a in sh cat chroot dd echo grep insmod mkdir mount printf poweroff sleep sync; do
    ln -s busybox "$tree/bin/$a"
  done
  # modprobe resolves dependencies against the unpacked tree; keep first use.
  # shellcheck disable=SC2086
  modprobe -d "$KDIR" -S "$KVER" --show-depends -a $GUEST_MODULES |
    awk '$1 == "insmod" && !seen[$2]++ { print $2 }' > "$tree/modules.list" ||
    die "resolving guest modules failed"
  while read -r ko; do
    cp "$ko" "$tree/modules/"
    basename "$ko" >> "$tree/modules/order"
  done < "$tree/modules.list"
  rm "$tree/modules.list"
  printf '%s\n' "$INIT_SCRIPT" > "$tree/init"
  chmod 755 "$tree/init"
  (cd "$tree" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp" ||
    die "building the initramfs failed"
  mv "$INITRD.tmp" "$INITRD"
  rm -rf "$tree"
fi

# ------------------------------------------------------------- accelerator --
# Common QEMU arguments of every guest. -nodefaults/romfile= avoid devices and
# option ROMs we do not need (also: ipxe need not be installed).
KAPPEND="console=ttyS0 panic=-1 nokaslr mitigations=off tsc=reliable no_timer_check i8042.nokbd i8042.noaux i8042.nopnp"
[ "$VERBOSE" = 1 ] || KAPPEND="$KAPPEND quiet loglevel=1"
QEMU_BASE=(-nodefaults -no-user-config -display none -no-reboot -monitor none
           -m "$MEM" -smp "$SMP" -kernel "$KERNEL" -initrd "$INITRD"
           -device isa-debug-exit,iobase=0xf4,iosize=0x04 -serial stdio)
ACCEL_TCG=(-accel tcg,thread=multi -cpu max)
ACCEL_KVM=(-accel kvm -cpu host)

# KVM is only worth it if it really runs a stock kernel: on some hosts /dev/kvm
# is a paravirtual implementation (no VMX) where such a kernel hangs or crawls.
# So boot the real kernel + initramfs once with a hard bound; "reached init and
# loaded the modules in time" is the verdict, cached per host kernel/QEMU/guest.
kvm_probe() {
  local key verdict out pid i
  key=$(printf '%s\n' "$(uname -r)" "$("$QEMU" --version | head -1)" "$KVER" | md5sum | cut -c1-12)
  verdict=$CACHE/kvm-verdict-$key
  if [ -s "$verdict" ]; then cat "$verdict"; return; fi
  if [ ! -w /dev/kvm ]; then echo no; return; fi # not cached: may change with permissions
  out=$(mktemp "$CACHE/kvm-probe.XXXXXX")
  "$QEMU" "${QEMU_BASE[@]}" "${ACCEL_KVM[@]}" -append "$KAPPEND rsock.probe=1" < /dev/null > "$out" 2>&1 &
  pid=$!
  for ((i = 0; i < KVM_PROBE_SECS * 10; i++)); do
    grep -q RSOCK-VM-PROBE-OK "$out" && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  if grep -q RSOCK-VM-PROBE-OK "$out"; then echo yes > "$verdict"; else echo no > "$verdict"; fi
  kill -KILL "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  note "KVM probe: $(sed 's/yes/usable/; s/no/not usable, using TCG/' "$verdict") (verdict cached in $verdict)"
  log "KVM probe console: $(tail -c 300 "$out" | tr '\n' ' ')"
  rm -f "$out"
  cat "$verdict"
}
case $ACCEL in
  tcg) ACCEL_ARGS=("${ACCEL_TCG[@]}") ;;
  kvm) ACCEL_ARGS=("${ACCEL_KVM[@]}") ;;
  auto)
    if [ "$(kvm_probe)" = yes ]; then ACCEL=kvm ACCEL_ARGS=("${ACCEL_KVM[@]}")
    else ACCEL=tcg ACCEL_ARGS=("${ACCEL_TCG[@]}"); fi ;;
esac
flock -u 8
log "accelerator: $ACCEL, kernel $KERNEL"

# --------------------------------------------------------------- guest side --
# These functions run INSIDE the guests (bash from the host root, chrooted).
# They are copied into the run directory with `declare -f`, so they are
# written and syntax-checked here, next to the code that relies on them.

rsock_signal() { : > "$RSOCK_VM_SYNC/$1"; }
rsock_wait() {
  local name=$1 secs=${2:-120} i
  for ((i = 0; i < secs * 10; i++)); do
    [ -e "$RSOCK_VM_SYNC/$name" ] && return 0
    if [ -e "$RSOCK_VM_SYNC/$RSOCK_VM_PEER.done" ]; then
      echo "rsock_wait: host $RSOCK_VM_PEER ended without signalling '$name'" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "rsock_wait: no '$name' after ${secs}s" >&2
  return 1
}
rsock_listening() { # is a TCP or rdma_cm listener on local port $1?
  [ -n "$(ss -Hltn "sport = :$1" 2> /dev/null)" ] && return 0
  rdma resource show cm_id 2> /dev/null | grep 'state LISTEN' | grep -Eq ":$1( |$)"
}
rsock_wait_listen() {
  local port=$1 secs=${2:-120} i
  for ((i = 0; i < secs * 10; i++)); do
    rsock_listening "$port" && return 0
    sleep 0.1
  done
  echo "rsock_wait_listen: nothing listens on port $port after ${secs}s" >&2
  return 1
}
rsock_retry() {
  local tries=$1 delay=$2 n
  shift 2
  for ((n = 1; ; n++)); do
    "$@" && return 0
    [ "$n" -ge "$tries" ] && { echo "rsock_retry: '$*' failed $n times" >&2; return 1; }
    echo "rsock_retry: '$*' failed (attempt $n/$tries), retrying in ${delay}s" >&2
    sleep "$delay"
  done
}

# Runs as guest.sh in each guest: mounts, network, rxe, barrier, the command.
# Its status file (A.rc/B.rc) is what the host reports.
guest_main() {
  local run=/run/rsock-vm host="?" peer rc d i w
  setup_failed() { echo "rsock-vm[$host]: setup failed: $*"; echo 125 > "$run/$host.rc"; : > "$run/sync/$host.done"; exit 125; }
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  # Kernel file systems first (until then /proc is the host's, seen over 9p).
  { mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev; } ||
    setup_failed "proc/sys/dev mounts"
  for w in $(< /proc/cmdline); do case $w in rsock.host=*) host=${w#rsock.host=} ;; esac; done
  case $host in A) peer=B ;; B) peer=A ;; *) echo "rsock-vm: no rsock.host= on the kernel command line"; exit 125 ;; esac
  : > "$run/$host.booted"

  # tmpfs where programs expect to write.
  mkdir -p /dev/pts /dev/shm
  { mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm; } || setup_failed "devpts/shm"
  for d in /tmp /var/tmp /root /var/log; do
    [ -d "$d" ] && { mount -t tmpfs -o mode=1777 tmpfs "$d" || setup_failed "tmpfs on $d"; }
  done
  # Read-write shares (tags rw0, rw1, ...), parents before children.
  i=0
  while IFS= read -r d; do
    mkdir -p "$d" 2> /dev/null
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap "rw$i" "$d" || setup_failed "mount $d"
    i=$((i + 1))
  done < "$run/rw-dirs"
  hostname "rsock-$host" 2> /dev/null
  ulimit -l unlimited # RDMA memory registration pins pages

  # The wire and soft-RoCE on it.
  local ip=10.20.0.1 peer_ip=10.20.0.2 ip6=fd00:20::1 peer_ip6=fd00:20::2
  [ "$host" = B ] && ip=10.20.0.2 peer_ip=10.20.0.1 ip6=fd00:20::2 peer_ip6=fd00:20::1
  { ip link set lo up && ip link set eth0 mtu "$VM_MTU" up && ip addr add "$ip/24" dev eth0 &&
    ip -6 addr add "$ip6/64" dev eth0 nodad; } ||
    setup_failed "eth0 configuration"
  rdma link add rxe0 type rxe netdev eth0 || setup_failed "rdma link add rxe0"
  for ((i = 0; i < 100; i++)); do rdma link show rxe0/1 2> /dev/null | grep -q 'state ACTIVE' && break; sleep 0.1; done
  rdma link show rxe0/1 2> /dev/null | grep -q 'state ACTIVE' || setup_failed "rxe0 never became ACTIVE"

  export RSOCK_VM=1 RSOCK_VM_HOST=$host RSOCK_VM_PEER=$peer RSOCK_VM_IP=$ip RSOCK_VM_PEER_IP=$peer_ip RSOCK_VM_IP6=$ip6 RSOCK_VM_PEER_IP6=$peer_ip6
  export RSOCK_VM_DEV=rxe0 RSOCK_VM_NETDEV=eth0 RSOCK_VM_SYNC=$run/sync
  export -f rsock_signal rsock_wait rsock_listening rsock_wait_listen rsock_retry

  # Barrier: "up" = own link ready; then prove IP reachability (a TCP SYN to a
  # closed port must come back refused: that also resolves ARP); "ready" =
  # both directions verified. Commands start only when both are ready.
  rsock_signal "$host.up"
  rsock_wait "$peer.up" "$VM_BARRIER_SECS" || setup_failed "host $peer never came up"
  local ok=0 out
  for ((i = 0; i < 50; i++)); do
    out=$(timeout 5 bash -c ": <> /dev/tcp/$peer_ip/9" 2>&1) || true
    case $out in *refused*) ok=1; break ;; esac
    sleep 0.2
  done
  [ "$ok" = 1 ] || setup_failed "no IP connectivity to $peer_ip ($out)"
  rsock_signal "$host.ready"
  rsock_wait "$peer.ready" "$VM_BARRIER_SECS" || setup_failed "host $peer never became ready"

  # The command: the caller's environment, the caller's directory.
  (
    # shellcheck disable=SC1091
    . "$run/environment"
    export RSOCK_VM=1 RSOCK_VM_HOST=$host RSOCK_VM_PEER=$peer RSOCK_VM_IP=$ip RSOCK_VM_PEER_IP=$peer_ip
    export RSOCK_VM_IP6=$ip6 RSOCK_VM_PEER_IP6=$peer_ip6
    export RSOCK_VM_DEV=rxe0 RSOCK_VM_NETDEV=eth0 RSOCK_VM_SYNC=$run/sync
    cd "$VM_CWD" || exit 125
    exec bash -c "$(< "$run/$host.cmd")"
  )
  rc=$?
  echo "$rc" > "$run/$host.rc"
  : > "$run/sync/$host.done"
  return "$rc"
}

# ---------------------------------------------------------------- run dir --
# Guest processes and their fate, and how to tear them down.
declare -A PID=() PREFIX_PID=() RC=() T_UP=() T_END=() HOW=()
alive() { # running and not yet a zombie
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}
stop_guest() { # TERM (QEMU exits cleanly), then KILL; only our own PIDs
  local pid=${PID[$1]:-} i
  [ -n "$pid" ] || return 0
  if alive "$pid"; then
    kill -TERM "$pid" 2> /dev/null || true
    for ((i = 0; i < 30; i++)); do alive "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2> /dev/null || true
  fi
}
teardown() {
  local g
  for g in A B; do stop_guest "$g"; done
  for g in A B; do
    [ -n "${PID[$g]:-}" ] && { wait "${PID[$g]}" 2> /dev/null || true; }
    [ -n "${PREFIX_PID[$g]:-}" ] && { wait "${PREFIX_PID[$g]}" 2> /dev/null || true; }
  done
  PID=() PREFIX_PID=()
  if [ "${RSOCK_VM_KEEP:-0}" = 1 ]; then note "run directory kept: $RUN"; else rm -rf "$RUN"; fi
}

mkdir -p "$CACHE/runs"
RUN=$(mktemp -d "$CACHE/runs/run.XXXXXX")
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir "$RUN/sync"
printf '%s\n' "$CMD_A" > "$RUN/A.cmd"
printf '%s\n' "$CMD_B" > "$RUN/B.cmd"

# Read-write directories: the current one plus RSOCK_VM_RW, sorted so that a
# parent is mounted before a directory inside it.
rw_dirs=("$CWD")
IFS=: read -ra extra <<< "${RSOCK_VM_RW:-}"
for d in "${extra[@]}"; do
  [ -n "$d" ] || continue
  d=$(cd "$d" 2> /dev/null && pwd -P) || die "RSOCK_VM_RW: no directory '$d'"
  [ "$d" != / ] || die "RSOCK_VM_RW cannot contain /"
  rw_dirs+=("$d")
done
printf '%s\n' "${rw_dirs[@]}" | awk '!seen[$0]++' | awk '{ print length($0) "\t" $0 }' | sort -n | cut -f2- > "$RUN/rw-dirs"

# The caller's exported environment, minus what describes this shell or host.
for name in $(compgen -e); do
  case $name in PWD | OLDPWD | SHLVL | _ | HOSTNAME | TERM | TMPDIR | BASH_* | RSOCK_VM_* | RSOCK_VM) continue ;; esac
  printf 'export %s=%q\n' "$name" "${!name}"
done > "$RUN/environment"

{
  echo "# generated by test/rdma/vm.sh; runs inside each guest"
  printf 'VM_CWD=%q VM_MTU=%q VM_BARRIER_SECS=%q\n' "$CWD" "$MTU" "$((TIMEOUT < 300 ? TIMEOUT : 300))"
  declare -f rsock_signal rsock_wait rsock_listening rsock_wait_listen rsock_retry guest_main
  echo 'guest_main'
} > "$RUN/guest.sh"
bash -n "$RUN/guest.sh" || die "generated guest.sh does not parse"

# ------------------------------------------------------------------ guests --

# Two free UDP ports on 127.0.0.1 for the two ends of the emulated wire.
used_ports=" $(ss -Hlnu 2> /dev/null | awk '{ n = split($4, a, ":"); printf "%s ", a[n] }') "
pick_port() { # $1 = a port not to pick
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 40000))
    [[ $used_ports == *" $p "* ]] || [ "$p" = "${1:-}" ] || { echo "$p"; return; }
  done
  die "no free UDP port found"
}
PORT_A=$(pick_port)
PORT_B=$(pick_port "$PORT_A")

start_guest() { # $1 = A|B, $2 = own UDP port, $3 = peer UDP port, $4 = MAC
  local g=$1 i=0 d args
  args=("${QEMU_BASE[@]}" "${ACCEL_ARGS[@]}" -name "rsock-vm-$g"
    -netdev "dgram,id=wire,local.type=inet,local.host=127.0.0.1,local.port=$2,remote.type=inet,remote.host=127.0.0.1,remote.port=$3"
    -device "virtio-net-pci,netdev=wire,mac=$4,romfile="
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
    -virtfs "local,path=$RUN,mount_tag=run,security_model=none")
  while IFS= read -r d; do
    args+=(-virtfs "local,path=$d,mount_tag=rw$i,security_model=none,multidevs=remap")
    i=$((i + 1))
  done < "$RUN/rw-dirs"
  args+=(-append "$KAPPEND rsock.host=$g")
  log "guest $g: $QEMU ${args[*]}"
  mkfifo "$RUN/$g.console"
  # Console lines get the host prefix; \r comes from the tty's onlcr.
  sed -u -e 's/\r$//' -e "s/^/[$g] /" < "$RUN/$g.console" &
  PREFIX_PID[$g]=$!
  # Started directly (no wrapper) so that $! is the QEMU process itself.
  "$QEMU" "${args[@]}" < /dev/null > "$RUN/$g.console" 2> "$RUN/$g.qemu-stderr" &
  PID[$g]=$!
}


start_guest A "$PORT_A" "$PORT_B" 52:54:00:20:00:01
start_guest B "$PORT_B" "$PORT_A" 52:54:00:20:00:02

# ----------------------------------------------------------------- monitor --
deadline=$((SECONDS + TIMEOUT))
timed_out=0 failed_at=
running="A B"
while [ -n "$running" ]; do
  sleep 0.2
  for g in $running; do
    [ -z "${T_UP[$g]:-}" ] && [ -e "$RUN/sync/$g.up" ] && T_UP[$g]=$(since)s && log "host $g: eth0 + rxe0 up at ${T_UP[$g]}"
    alive "${PID[$g]}" && continue
    st=0
    wait "${PID[$g]}" 2> /dev/null || st=$?
    T_END[$g]=$(since)s
    if [ -s "$RUN/$g.rc" ]; then
      RC[$g]=$(< "$RUN/$g.rc")
      HOW[$g]=exited
    elif [ -z "${HOW[$g]:-}" ] && [ ! -e "$RUN/$g.booted" ] && grep -q . "$RUN/$g.qemu-stderr"; then
      HOW[$g]=qemu-failed RC[$g]=$EX_SKIP
      note "QEMU for host $g exited with status $st before the guest booted:"
      sed "s/^/rsock-vm:   [$g] /" "$RUN/$g.qemu-stderr" >&2
    elif [ -n "${HOW[$g]:-}" ]; then
      RC[$g]=- # killed by us (timeout, or after the peer failed)
    else
      HOW[$g]=crashed RC[$g]=$EX_SETUP
      note "host $g ended without an exit status (kernel panic or init failure? rerun with RSOCK_VM_VERBOSE=1)"
      grep -q . "$RUN/$g.qemu-stderr" && sed "s/^/rsock-vm:   [$g] /" "$RUN/$g.qemu-stderr" >&2
    fi
    : > "$RUN/sync/$g.done" # lets the peer's rsock_wait fail fast
    running=$(echo "$running" | tr ' ' '\n' | grep -vx "$g" | paste -sd' ' || true)
    if [ "${RC[$g]}" != 0 ] && [ -n "$running" ] && [ -z "$failed_at" ] && [ "$timed_out" = 0 ]; then
      failed_at=$SECONDS
      note "host $g failed (status ${RC[$g]}); host $running gets ${GRACE}s to finish"
    fi
  done
  [ -n "$running" ] || break
  if [ "$SECONDS" -ge "$deadline" ]; then
    note "TIMEOUT after ${TIMEOUT}s (RSOCK_VM_TIMEOUT); killing host(s) $running"
    timed_out=1
    for g in $running; do HOW[$g]=timeout; stop_guest "$g"; done
  elif [ -n "$failed_at" ] && [ $((SECONDS - failed_at)) -ge "$GRACE" ]; then
    for g in $running; do note "killing host $g"; HOW[$g]=killed; stop_guest "$g"; done
  fi
done
for g in A B; do wait "${PREFIX_PID[$g]}" 2> /dev/null || true; done

note "A: ${HOW[A]} status ${RC[A]} (link up ${T_UP[A]:-never}, end ${T_END[A]});" \
  "B: ${HOW[B]} status ${RC[B]} (link up ${T_UP[B]:-never}, end ${T_END[B]}); accel $ACCEL; total $(since)s"
if [ "$timed_out" = 1 ]; then exit "$EX_TIMEOUT"; fi
if [ "${HOW[A]}" = qemu-failed ] || [ "${HOW[B]}" = qemu-failed ]; then
  skip "QEMU could not start a guest (its messages are above)"
fi
# A failed command's own status beats the consequences it had on the peer.
for g in A B; do
  [ "${HOW[$g]}" = exited ] && [ "${RC[$g]}" != 0 ] && exit "${RC[$g]}"
done
for g in A B; do [ "${HOW[$g]}" = exited ] || exit "$EX_SETUP"; done
exit 0
