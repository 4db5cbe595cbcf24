#!/usr/bin/env bash
# Two network namespaces ("hosts" A and B) joined by a veth pair, for running dmx between
# two hosts on one machine.
#
#   scripts/netns.sh up     [SUFFIX] [--mtu N] [--delay D] [--jitter J] [--loss P] [--rate R]
#   scripts/netns.sh netem  SUFFIX   [--delay D] [--jitter J] [--loss P] [--rate R] | --clear
#   scripts/netns.sh exec   SUFFIX a|b [--] CMD [ARGS...]
#   scripts/netns.sh addr   SUFFIX a|b          # prints the side's address, e.g. 10.199.0.1
#   scripts/netns.sh name   SUFFIX a|b          # prints the namespace name
#   scripts/netns.sh env    SUFFIX              # prints shell assignments (NS_A, ADDR_A, ...)
#   scripts/netns.sh down   SUFFIX              # idempotent; kills what still runs inside
#   scripts/netns.sh list                       # dmx-test-* namespaces that exist now
#
# Names: namespaces dmx-test-SUFFIX-a and dmx-test-SUFFIX-b. SUFFIX defaults to $DMX_NETNS_SUFFIX,
# then to this shell's pid ($$) for `up` (printed, so the caller can tear down), so concurrent
# runs do not collide. The veth pair is created directly inside the namespaces (interface
# dmx0 on both sides), so nothing appears in the root namespace.
# Addresses: a private /30 that only exists inside the two namespaces:
# A = 10.199.0.1/30, B = 10.199.0.2/30 (override the network with DMX_NETNS_NET=10.x.y.z,
# whose last octet must be a multiple of 4). Loopback is up in both.
# netem: --delay/--jitter/--loss/--rate apply on BOTH veth ends, i.e. per direction: a
# --delay 5ms gives a 10 ms round trip. The kernel needs sch_netem; when it is missing the
# command says so and fails (nothing is left half-configured: `up` tears down again).
# Exit status: 0 done; 1 failed (message on stderr); 2 usage; 3 refused (not root, no ip netns,
# namespaces or veth pairs cannot be made here).
set -euo pipefail

PREFIX=dmx-test
IFACE=dmx0
NET=${DMX_NETNS_NET:-10.199.0.0}

die() { echo "netns.sh: $*" >&2; exit 1; }
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
refuse() { echo "netns.sh: refused: $*" >&2; exit 3; }

check_env() {
  [ "$(id -u)" -eq 0 ] || refuse "must run as root (uid is $(id -u)); ip netns needs CAP_SYS_ADMIN"
  command -v ip >/dev/null 2>&1 || refuse "'ip' (iproute2) not found"
  local err
  if ! err=$(ip netns list 2>&1); then
    refuse "'ip netns' unavailable: $err"
  fi
}

check_suffix() {
  [[ "$1" =~ ^[A-Za-z0-9_]{1,24}$ ]] || { echo "netns.sh: bad suffix '$1' (letters, digits, _; at most 24)" >&2; exit 2; }
}

ns_name() { echo "$PREFIX-$1-$2"; }  # suffix side

ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$1"; }

addr_of() {  # side -> address (no prefix length)
  local a b c d
  IFS=. read -r a b c d <<<"$NET"
  if ! [[ "$a.$b.$c.$d" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || [ $((d % 4)) -ne 0 ] || [ "$d" -gt 252 ]; then
    die "DMX_NETNS_NET=$NET is not a /30 network address"
  fi
  case "$1" in
    a) echo "$a.$b.$c.$((d + 1))" ;;
    b) echo "$a.$b.$c.$((d + 2))" ;;
    *) echo "netns.sh: side must be a or b, got '$1'" >&2; exit 2 ;;
  esac
}

# Parses netem options into the global array NETEM (tc netem arguments) and sets CLEAR.
parse_netem() {
  NETEM=(); CLEAR=0; MTU=""
  local delay="" jitter="" loss="" rate=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      --jitter) jitter=${2:?--jitter needs a value}; shift 2 ;;
      --loss) loss=${2:?--loss needs a value}; shift 2 ;;
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --mtu) MTU=${2:?--mtu needs a value}; shift 2 ;;
      --clear) CLEAR=1; shift ;;
      *) echo "netns.sh: unknown option '$1'" >&2; usage ;;
    esac
  done
  if [ -n "$jitter" ] && [ -z "$delay" ]; then echo "netns.sh: --jitter needs --delay" >&2; exit 2; fi
  if [ -n "$delay" ]; then NETEM+=(delay "$delay"); [ -n "$jitter" ] && NETEM+=("$jitter"); fi
  if [ -n "$loss" ]; then NETEM+=(loss "$loss"); fi
  if [ -n "$rate" ]; then NETEM+=(rate "$rate"); fi
  return 0
}

apply_netem() {  # suffix
  local s=$1 side ns out
  for side in a b; do
    ns=$(ns_name "$s" "$side")
    if [ "$CLEAR" -eq 1 ]; then
      ip -n "$ns" link show "$IFACE" >/dev/null 2>&1 || die "namespace $ns has no $IFACE (is it up?)"
      # Deleting a root qdisc that is not there is fine: nothing to clear.
      tc -n "$ns" qdisc del dev "$IFACE" root 2>/dev/null || true
    elif [ "${#NETEM[@]}" -gt 0 ]; then
      if ! out=$(tc -n "$ns" qdisc replace dev "$IFACE" root netem "${NETEM[@]}" 2>&1); then
        die "tc netem on $ns/$IFACE failed: $out (is sch_netem in this kernel?)"
      fi
    fi
  done
}

on_up_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "netns.sh: up failed; tearing down $UP_SUFFIX" >&2
    teardown "$UP_SUFFIX"
  fi
}

cmd_up() {
  local s=${DMX_NETNS_SUFFIX:-$$}
  if [ $# -gt 0 ] && [[ "$1" != --* ]]; then s=$1; shift; fi
  check_suffix "$s"
  parse_netem "$@"
  [ "$CLEAR" -eq 0 ] || { echo "netns.sh: --clear is for 'netem'" >&2; exit 2; }
  local na nb aa ab
  na=$(ns_name "$s" a); nb=$(ns_name "$s" b); aa=$(addr_of a); ab=$(addr_of b)
  if ns_exists "$na" || ns_exists "$nb"; then
    die "namespaces for suffix '$s' already exist; run: $0 down $s"
  fi
  # Any failure from here on removes what was made.
  UP_SUFFIX=$s
  trap on_up_exit EXIT
  # Where namespaces or veth pairs cannot be made (a container without the capability, a kernel
  # without veth), say so as a refusal (exit 3): tests skip with this reason instead of failing.
  local err
  err=$(ip netns add "$na" 2>&1) || refuse "cannot make a network namespace here: ip netns add: $err"
  err=$(ip netns add "$nb" 2>&1) || refuse "cannot make a network namespace here: ip netns add: $err"
  err=$(ip link add "$IFACE" netns "$na" type veth peer name "$IFACE" netns "$nb" 2>&1) ||
    refuse "cannot make a veth pair here: $err"
  for side in a b; do
    local ns addr
    ns=$(ns_name "$s" "$side"); addr=$(addr_of "$side")
    ip -n "$ns" link set lo up
    [ -z "$MTU" ] || ip -n "$ns" link set "$IFACE" mtu "$MTU"
    ip -n "$ns" addr add "$addr/30" dev "$IFACE"
    ip -n "$ns" link set "$IFACE" up
  done
  apply_netem "$s"
  trap - EXIT
  echo "netns.sh: up $s: $na ($aa) <-> $nb ($ab)${NETEM:+ netem: ${NETEM[*]} per direction}${MTU:+ mtu $MTU}" >&2
  echo "$s"
}

# Kills what still runs inside a namespace (it was started there by the caller), then
# deletes it. Safe to call when the namespace does not exist.
teardown() {
  local s=$1 side ns pids
  for side in a b; do
    ns=$(ns_name "$s" "$side")
    ns_exists "$ns" || continue
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)
    if [ -n "${pids// /}" ]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)
        [ -n "${pids// /}" ] || break
        sleep 0.2
      done
      # shellcheck disable=SC2086
      [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null || true
    fi
    if ! ip netns del "$ns" 2>/dev/null && ns_exists "$ns"; then
      echo "netns.sh: could not delete $ns" >&2
    fi
  done
}

cmd_down() {
  local s=${1:-${DMX_NETNS_SUFFIX:-}}
  [ -n "$s" ] || { echo "netns.sh: down needs a SUFFIX" >&2; exit 2; }
  check_suffix "$s"
  teardown "$s"
  local side
  for side in a b; do ns_exists "$(ns_name "$s" "$side")" && die "namespace $(ns_name "$s" "$side") still exists"; done
  echo "netns.sh: down $s" >&2
}

need_up() {  # suffix side
  ns_exists "$(ns_name "$1" "$2")" || die "namespace $(ns_name "$1" "$2") does not exist; run: $0 up $1"
}

main() {
  [ $# -gt 0 ] || usage
  local cmd=$1; shift
  case "$cmd" in
    -h|--help|help) usage ;;
    up) check_env; cmd_up "$@" ;;
    down) check_env; cmd_down "$@" ;;
    netem)
      check_env
      [ $# -ge 1 ] || usage
      local s=$1; shift; check_suffix "$s"; need_up "$s" a; need_up "$s" b
      parse_netem "$@"
      [ "$CLEAR" -eq 1 ] || [ "${#NETEM[@]}" -gt 0 ] || { echo "netns.sh: netem needs options or --clear" >&2; exit 2; }
      apply_netem "$s" ;;
    exec)
      check_env
      [ $# -ge 3 ] || usage
      local s=$1 side=$2; shift 2; check_suffix "$s"; addr_of "$side" >/dev/null
      [ "${1:-}" != "--" ] || shift
      need_up "$s" "$side"
      exec ip netns exec "$(ns_name "$s" "$side")" "$@" ;;
    addr) [ $# -eq 2 ] || usage; check_suffix "$1"; addr_of "$2" ;;
    name) [ $# -eq 2 ] || usage; check_suffix "$1"; addr_of "$2" >/dev/null; ns_name "$1" "$2" ;;
    env)
      [ $# -eq 1 ] || usage; check_suffix "$1"
      echo "NS_A=$(ns_name "$1" a)"; echo "NS_B=$(ns_name "$1" b)"
      echo "ADDR_A=$(addr_of a)"; echo "ADDR_B=$(addr_of b)"; echo "IFACE=$IFACE" ;;
    list) check_env; ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true ;;
    *) echo "netns.sh: unknown command '$cmd'" >&2; usage ;;
  esac
}

main "$@"
