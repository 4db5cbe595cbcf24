#!/usr/bin/env bash
# Runs commands in a throwaway Debian 12 guest with soft-RoCE (rxe0 on the guest's lo), under
# qemu without KVM. The host needs no InfiniBand and loads no module: the guest boots Debian's
# stock kernel (linux-image-amd64, which has rdma_rxe as a module) from an initramfs built here.
#
#   bash scripts/rxe-vm.sh [options] -- CMD [ARGS...] [-- CMD [ARGS...]]...
#   bash scripts/rxe-vm.sh --perftest            # smoke test: ibv_devinfo, ib_write_lat, ib_write_bw
#
# Each `--` starts a command; the commands run one after another in the guest (cwd: the host's
# cwd), output on this terminal. A command's first word is copied into the guest with every shared
# library it needs (ldd), at the same absolute path, unless busybox provides it; NAME=VALUE words
# before it set its environment. Options:
#   --timeout S   deadline for the whole guest run, boot included (default 900 s); past it, the
#                 guest is killed and the run fails
#   --file PATH   also copy PATH into the guest at the same path (a directory: its tree; an ELF
#                 file: with its libraries); repeatable. For data files and helper binaries
#   --sh SCRIPT   a command run by the guest's busybox sh (pipes, `&`, loops); repeatable
#   --perftest    add the smoke test (the binaries come from perftest and ibverbs-utils)
#   --mem MIB     guest memory (default 2048)    --smp N   guest CPUs (default 2)
#   --keep        keep the work directory (initramfs, console log) and print its path
# The guest sets DMX_RXE_GUEST=1: a test that skips without an rdma device should fail there instead.
# Exits 0 when every command exited 0; otherwise 1 (a command failed), 2 (usage), 3 (the guest
# did not boot or did not finish: kernel panic, timeout). The console log's last lines say which.
#
# Downloads (the kernel package, once per Debian kernel version) are cached in $RXE_VM_CACHE
# (default build/rxe-vm); what must be installed comes from scripts/install-deps.sh.
# rxe is functional, not fast (an emulated CPU): its numbers are no performance result.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${RXE_VM_CACHE:-$root/build/rxe-vm}"
timeout_s=900 mem=2048 smp=2 keep=0
files=() cmds=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }  # single-quote for the guest's sh

# The client starts once the server listens on perftest's port 18515 (0x4853): an emulated CPU on
# a busy host can take seconds to get there.
perftest_cmd='ibv_devinfo -d rxe0 &&
for t in "ib_write_lat -s 8 -n 1000" "ib_write_bw -s 1048576 -n 100"; do
  echo "== $t (server and client on rxe0, over lo)"
  $t -d rxe0 -F >/tmp/server.log 2>&1 & s=$!
  i=0
  until grep -q ":4853 [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 || [ $i -ge 120 ]; do
    sleep 0.5; i=$((i + 1))
  done
  $t -d rxe0 -F 127.0.0.1 || { cat /tmp/server.log; exit 1; }
  wait $s || { echo "server failed:"; cat /tmp/server.log; exit 1; }
done'

while [[ $# -gt 0 ]]; do
  case "$1" in
    --timeout) timeout_s=${2:?}; shift 2 ;;
    --mem) mem=${2:?}; shift 2 ;;
    --smp) smp=${2:?}; shift 2 ;;
    --file) files+=("${2:?}"); shift 2 ;;
    --sh) cmds+=("${2:?}"); shift 2 ;;
    --keep) keep=1; shift ;;
    --perftest)
      files+=(/usr/bin/ibv_devinfo /usr/bin/ib_write_lat /usr/bin/ib_write_bw)
      cmds+=("$perftest_cmd"); shift ;;
    --)
      shift
      [[ $# -gt 0 && $1 != -- ]] || usage
      words=()
      while [[ $# -gt 0 && $1 != -- ]]; do words+=("$1"); shift; done
      # Leading NAME=VALUE words set the command's environment, as in the shell.
      line="" c=0
      while [[ $c -lt ${#words[@]} && ${words[c]} =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
        line+="${words[c]%%=*}=$(q "${words[c]#*=}") "
        c=$((c + 1))
      done
      [[ $c -lt ${#words[@]} ]] || usage
      if ! busybox --list | grep -qx -- "${words[c]}"; then
        exe=$(command -v -- "${words[c]}") || { echo "rxe-vm: no such command: ${words[c]}" >&2; exit 2; }
        exe=$(realpath -- "$exe")
        files+=("$exe")
        words[c]=$exe
      fi
      for w in "${words[@]:c}"; do line+="$(q "$w") "; done
      cmds+=("$line") ;;
    -h|--help) usage ;;
    *) echo "rxe-vm: unknown option $1" >&2; usage ;;
  esac
done
[[ ${#cmds[@]} -gt 0 ]] || usage
for t in qemu-system-x86_64 busybox cpio rdma; do
  command -v "$t" >/dev/null || { echo "rxe-vm: $t missing: run scripts/install-deps.sh" >&2; exit 2; }
done

# --- The kernel: Debian's current stock kernel package, downloaded once, its modules kept. ---
mkdir -p "$cache"
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1)
[[ -n $pkg ]] || { echo "rxe-vm: apt knows no linux-image-amd64 (Debian only; apt-get update?)" >&2; exit 2; }
kver=${pkg#linux-image-}
kdir="$cache/$kver"
want_mods=(crc32_generic rdma_rxe ib_uverbs)  # rdma_rxe pulls ib_core and the udp tunnels
exec 9>"$cache/.lock"
flock 9  # one fetch at a time; runs that find the kernel there go on in parallel
if [[ ! -f $kdir/modules.order ]]; then
  echo "rxe-vm: fetching $pkg (Debian's linux-image-amd64) into $cache"
  # Kernels Debian replaced since: only the current one is kept.
  find "$cache" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*' ! -name "$kver" -exec rm -rf {} +
  rm -rf "$kdir" "$cache/extract"
  mkdir -p "$kdir" "$cache/extract"
  # Stale package lists name a version the mirror dropped: refresh them once (root only).
  (cd "$cache" && rm -f "$pkg"_*.deb &&
    { apt-get download -q "$pkg" || { [[ $(id -u) -eq 0 ]] && apt-get update -qq && apt-get download -q "$pkg"; }; } 2>&1 |
    grep -v '^W: Download is performed unsandboxed' || true)
  deb=$(ls "$cache/$pkg"_*.deb 2>/dev/null) || { echo "rxe-vm: apt-get download $pkg failed" >&2; exit 3; }
  dpkg-deb -x "$deb" "$cache/extract"
  cp "$cache/extract/boot/vmlinuz-$kver" "$kdir/vmlinuz"
  mdir="$cache/extract/lib/modules/$kver/kernel"
  declare -A seen=()
  order=()
  # Depth-first over each module's "depends=" (.modinfo), so that a module follows what it needs.
  add_mod() {
    local m=$1 f d
    [[ -z ${seen[$m]:-} ]] || return 0
    seen[$m]=1
    f=$(find "$mdir" \( -name "$m.ko" -o -name "${m//_/-}.ko" \) -print -quit)
    [[ -n $f ]] || { echo "rxe-vm: $kver has no module $m" >&2; exit 3; }
    for d in $(objcopy -O binary -j .modinfo "$f" /dev/stdout | tr '\0' '\n' | sed -n 's/^depends=//p' | tr , ' '); do
      add_mod "$d"
    done
    mkdir -p "$kdir/modules"
    cp "$f" "$kdir/modules/$m.ko"
    order+=("$m")
  }
  for m in "${want_mods[@]}"; do add_mod "$m"; done
  printf '%s\n' "${order[@]}" >"$kdir/modules.order"
  rm -rf "$cache/extract" "$deb"
fi
# The uncompressed kernel, booted through its PVH entry: an emulated CPU takes seconds to undo
# the bzImage's xz. (Not a pipe: xz stops after the stream and tail's SIGPIPE would fail it.)
if [[ ! -f $kdir/vmlinux && ! -f $kdir/vmlinux.none ]]; then
  off=$(grep -abo $'\xfd7zXZ\x00' "$kdir/vmlinuz" | head -1 | cut -d: -f1)
  if [[ -n $off ]] && xz -dc --single-stream <(tail -c +$((off + 1)) "$kdir/vmlinuz") >"$kdir/vmlinux.tmp" &&
    readelf -n "$kdir/vmlinux.tmp" 2>/dev/null | grep -q '^ *Xen '; then
    mv "$kdir/vmlinux.tmp" "$kdir/vmlinux"
  else
    echo "rxe-vm: no uncompressed kernel from $kdir/vmlinuz: booting it compressed (slower)" >&2
    rm -f "$kdir/vmlinux.tmp"
    touch "$kdir/vmlinux.none"
  fi
fi
exec 9>&-

# --- The initramfs: busybox init, modules, rdma-core's rxe provider, the rdma tool, the commands. ---
work=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm.XXXXXX")
cleanup() {
  if [[ $keep -eq 1 ]]; then echo "rxe-vm: work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
st="$work/root"
tag="@@rxe-vm-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
mkdir -p "$st"/{usr/bin,usr/sbin,usr/lib,usr/lib64,proc,sys,dev,tmp,run,etc,bb,lib/modules}
for l in bin sbin lib64; do ln -s "usr/$l" "$st/$l"; done
mv "$st/lib/modules" "$st/usr/lib/" && rmdir "$st/lib" && ln -s usr/lib "$st/lib"

declare -A copied=()
# copy_in PATH: PATH at the same path in the guest; ELF files with their libraries. Debug info is
# stripped from what is not the distribution's (smaller initramfs, faster boot).
copy_in() {
  local p=$1 real lib
  [[ -z ${copied[$p]:-} ]] || return 0
  copied[$p]=1
  [[ -e $p ]] || { echo "rxe-vm: $p does not exist" >&2; exit 2; }
  if [[ -d $p && ! -L $p ]]; then
    mkdir -p "$st$p" && cp -a "$p/." "$st$p/"
    return 0
  fi
  mkdir -p "$st$(dirname "$p")"
  if [[ -L $p ]]; then
    real=$(realpath "$p")
    cp -a "$p" "$st$p"
    copy_in "$real"
    return 0
  fi
  if [[ $(head -c4 "$p" | od -An -c | tr -d ' ') == 177ELF ]]; then
    case "$p" in
      /usr/*|/lib/*|/lib64/*) cp "$p" "$st$p" ;;
      *) objcopy --strip-debug "$p" "$st$p" 2>/dev/null || cp "$p" "$st$p" ;;
    esac
    if ldd "$p" 2>/dev/null | grep 'not found'; then
      echo "rxe-vm: warning: libraries of $p not found here: it will not start in the guest" >&2
    fi
    for lib in $(ldd "$p" 2>/dev/null | grep -o '/[^ ]*' || true); do copy_in "$lib"; done
  else
    cp "$p" "$st$p"
  fi
}

copy_in "$(realpath "$(command -v busybox)")"  # static (busybox-static) or with its libraries
ln -s "$(realpath "$(command -v busybox)")" "$st/bb/busybox"
ln -s /bb/busybox "$st/usr/bin/sh"  # system() and popen() run /bin/sh
libdir=$(dirname "$(ldd "$(command -v rdma)" | sed -n 's/.*=> \(\/[^ ]*libc\.so\.6\).*/\1/p')")
for p in "$(command -v rdma)" /etc/libibverbs.d/rxe.driver "$libdir"/libibverbs/librxe-*.so; do copy_in "$p"; done
# The provider is opened by libibverbs at run time: ldd of a binary does not name it.
copy_in "$(ldconfig -p | sed -n 's/.*=> \(\/.*libibverbs\.so\.1\)$/\1/p' | head -1)"
for p in ${files[@]+"${files[@]}"}; do copy_in "$(realpath -s "$p")"; done
cp "$kdir"/modules/*.ko "$st/usr/lib/modules/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$st/etc/passwd"
printf 'root:x:0:\n' >"$st/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$st/etc/hosts"

{
  cat <<'EOF'
#!/bb/busybox sh
/bb/busybox --install -s /bb
export PATH=/usr/sbin:/usr/bin:/bb HOME=/root GTEST_COLOR=no DMX_RXE_GUEST=1
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
# /tmp stays on the initramfs (already RAM): a tmpfs there would hide files copied under /tmp.
mkdir -p /dev/shm /dev/pts /root /tmp; chmod 1777 /tmp; mount -t tmpfs shm /dev/shm
ulimit -l unlimited
EOF
  # The markers carry a fresh tag, so that no output of a command can pass for one.
  echo "fail() { echo \"$tag setup-failed: \$*\"; reboot -f; }"
  while read -r m; do echo "insmod /lib/modules/$m.ko || fail insmod $m"; done <"$kdir/modules.order"
  cat <<'EOF'
ip link set lo up || fail ip link set lo up
rdma link add rxe0 type rxe netdev lo || fail rdma link add rxe0
EOF
  echo "echo; echo \"$tag ready \$(cut -d' ' -f1 /proc/uptime) s after boot: \$(rdma link show rxe0/1)\""
  printf 'mkdir -p %s; cd %s\n' "$(q "$PWD")" "$(q "$PWD")"
  i=0
  for c in "${cmds[@]}"; do
    i=$((i + 1))
    printf 'echo "%s run %d: "%s\n' "$tag" "$i" "$(q "$c")"
    printf '(%s\n)\necho "%s rc %d $?"\n' "$c" "$tag" "$i"
  done
  echo "echo \"$tag done\""
  echo 'reboot -f'
} >"$st/init"
chmod +x "$st/init"
(cd "$st" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$work/initrd"

# --- Boot: no network device, serial console; `reboot -f` ends qemu (-no-reboot), so does a panic. ---
log="$work/console.log"
kernel="$kdir/vmlinux"
[[ -f $kernel ]] || kernel="$kdir/vmlinuz"
echo "rxe-vm: booting $pkg ($(du -h "$work/initrd" | cut -f1) initramfs, $smp CPUs, $mem MiB, deadline $timeout_s s)"
t0=$SECONDS
# In the background, so that a signal to this script (CI's own timeout, ^C) reaches qemu: a
# foreground pipeline would hold the trap until qemu's deadline.
mkfifo "$work/console"
tee "$log" <"$work/console" &
teepid=$!
timeout -k 5 "$timeout_s" qemu-system-x86_64 -accel tcg -cpu max -smp "$smp" -m "$mem" \
  -nographic -no-user-config -nodefaults -serial stdio -no-reboot -nic none \
  -kernel "$kernel" -initrd "$work/initrd" \
  -append "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off rdinit=/init" \
  </dev/null >"$work/console" 2>&1 &
qpid=$!
trap 'kill "$qpid" 2>/dev/null; exit 130' INT
trap 'kill "$qpid" 2>/dev/null; exit 143' TERM
rc=0
wait "$qpid" || rc=$?
wait "$teepid" || true
trap - INT TERM
elapsed=$((SECONDS - t0))
# Without carriage returns and the firmware's terminal escapes, so that markers start their lines.
sed 's/\r$//; s/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g' "$log" >"$log.txt"

echo "=== rxe-vm summary ($elapsed s in the guest, $pkg)"
grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]|^\[==========\] [0-9]+ tests? from' "$log.txt" || true
status=0
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
  echo "rxe-vm: FAILED: the guest passed its deadline of $timeout_s s (--timeout)"
  status=3
elif grep -q "^$tag setup-failed" "$log.txt"; then
  echo "rxe-vm: FAILED: guest setup: $(sed -n "s/^$tag setup-failed: //p" "$log.txt")"
  status=3
elif ! grep -qx "$tag done" "$log.txt"; then
  echo "rxe-vm: FAILED: the guest stopped before its commands finished (qemu rc $rc; kernel panic?)"
  status=3
fi
failed=0
for ((i = 1; i <= ${#cmds[@]}; i++)); do
  r=$(sed -n "s/^$tag rc $i \([0-9]*\)$/\1/p" "$log.txt")
  echo "rxe-vm: command $i: $([[ -n $r ]] && echo "rc $r" || echo "did not finish")"
  [[ $r == 0 ]] || failed=$((failed + 1))
done
if [[ $status -eq 0 && $failed -gt 0 ]]; then
  echo "rxe-vm: FAILED: $failed of ${#cmds[@]} commands"
  status=1
elif [[ $status -eq 0 ]]; then
  echo "rxe-vm: all ${#cmds[@]} commands passed"
fi
exit "$status"
