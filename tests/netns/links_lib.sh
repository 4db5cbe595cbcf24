# Two "hosts" joined by two links, for tests and benchmarks of several NICs (sourced, not run).
#
#   links_up SUFFIX        namespaces dmx-ml-SUFFIX-a and -b; link 1: ml0 10.201.1.1/30 <-> .2,
#                          link 2: ml1 10.201.2.1/30 <-> .2 (DMX_LINKS_NET overrides 10.201)
#   links_shape SUFFIX IF RATE   tbf at RATE (e.g. 1gbit) on IF at both ends; RATE "none" clears
#   links_down SUFFIX      idempotent; kills what still runs inside
#   links_addr SUFFIX LINK SIDE   the address of side a|b on link 1|2
#   links_wait_rx NS BYTES         waits until namespace NS received BYTES more on its links
# Returns 3 from links_up where namespaces or veth pairs cannot be made (not root).

LINKS_NET=${DMX_LINKS_NET:-10.201}

links_ns() { echo "dmx-ml-$1-$2"; }

links_up() {
  local s=$1 a b
  [[ $(id -u) -eq 0 ]] || { echo "needs root for ip netns"; return 3; }
  a=$(links_ns "$s" a); b=$(links_ns "$s" b)
  ip netns add "$a" 2>/dev/null || { echo "ip netns add failed"; return 3; }
  ip netns add "$b" || return 1
  for i in 0 1; do
    ip link add ml$i netns "$a" type veth peer name ml$i netns "$b" || { echo "no veth pairs here"; return 3; }
    ip -n "$a" addr add "$LINKS_NET.$((i + 1)).1/30" dev ml$i
    ip -n "$b" addr add "$LINKS_NET.$((i + 1)).2/30" dev ml$i
    ip -n "$a" link set ml$i up
    ip -n "$b" link set ml$i up
  done
  ip -n "$a" link set lo up
  ip -n "$b" link set lo up
}

links_shape() {
  local s=$1 dev=$2 rate=$3
  for side in a b; do
    tc -n "$(links_ns "$s" $side)" qdisc del dev "$dev" root 2>/dev/null
    [[ $rate == none ]] && continue
    # A burst of a few ms at the rate, and a queue short enough that TCP sees the rate promptly.
    tc -n "$(links_ns "$s" $side)" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 20ms || return 1
  done
}

links_down() {
  local s=$1 ns pid
  for side in a b; do
    ns=$(links_ns "$s" $side)
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}

# Waits (at most 60 s) until namespace NS has received BYTES more on its links: a transfer is under
# way, so operations are pending when the peer is then frozen (idle endpoints keep peer_timeout).
links_wait_rx() {  # NS BYTES
  local ns=$1 want=$2 start now i
  rx() { ip netns exec "$ns" cat /sys/class/net/ml0/statistics/rx_bytes /sys/class/net/ml1/statistics/rx_bytes | awk '{s += $1} END {printf "%.0f\n", s}'; }
  start=$(rx)
  for i in $(seq 600); do
    now=$(rx)
    (( now - start >= want )) && return 0
    sleep 0.1
  done
  return 1
}

links_addr() { echo "$LINKS_NET.$2.$([[ $3 == a ]] && echo 1 || echo 2)"; }  # SUFFIX LINK(1|2) SIDE
