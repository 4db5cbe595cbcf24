# N "hosts" on one switch, for the store tests (tests/netns/cluster.sh, scripts/soak-cluster.sh).
# Source it; root only. Namespaces dmxc-$CL_ID-sw (a bridge, and the store host at .254) and
# dmxc-$CL_ID-h0 .. h<N-1> (10.201.$CL_NET.<i+1>/24 on eth0), each with loopback up.
#   cl_up N        makes them (exit 3 from the caller's point of view when it cannot: see cl_skip)
#   cl_down        removes them, killing what still runs inside
#   cl_exec I CMD  runs CMD in host I ("sw" for the switch)
#   cl_addr I      host I's address
#   cl_etcd_start / cl_etcd_stop   Debian's etcd in the switch namespace at $CL_STORE (data kept)
CL_ID=${CL_ID:-$$}
CL_NET=${CL_NET:-$(( ($$ % 200) + 20 ))}
CL_N=0
CL_DIR=${CL_DIR:-/tmp/dmxc-$CL_ID}
CL_STORE_ADDR=10.201.$CL_NET.254
CL_STORE=etcd://$CL_STORE_ADDR:2379
CL_ETCD_PID=

cl_ns() { if [[ $1 == sw ]]; then echo "dmxc-$CL_ID-sw"; else echo "dmxc-$CL_ID-h$1"; fi; }
cl_addr() { echo "10.201.$CL_NET.$(( $1 + 1 ))"; }
cl_exec() { local i=$1; shift; ip netns exec "$(cl_ns "$i")" "$@"; }
# Starts CMD in host I in the background, appending its output to LOG; $! is CMD itself (exec:
# no shell in between), so a kill reaches the process.
cl_spawn() { local i=$1 log=$2; shift 2; ( exec ip netns exec "$(cl_ns "$i")" "$@" >> "$log" 2>&1 ) & }

# Why namespaces cannot be made here, or nothing.
cl_skip() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root for ip netns"; return; }
  command -v ip >/dev/null || { echo "no ip (iproute2)"; return; }
  ip netns add "dmxc-$CL_ID-probe" 2>/dev/null || { echo "ip netns add is refused here"; return; }
  ip netns del "dmxc-$CL_ID-probe"
}

cl_up() {
  CL_N=$1
  mkdir -p "$CL_DIR"
  local sw; sw=$(cl_ns sw)
  ip netns add "$sw" || return 1
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge || return 1
  ip -n "$sw" addr add "$CL_STORE_ADDR/24" dev br0
  ip -n "$sw" link set br0 up
  local i ns
  for (( i = 0; i < CL_N; i++ )); do
    ns=$(cl_ns "$i")
    ip netns add "$ns" || return 1
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$sw" || return 1
    ip -n "$ns" addr add "$(cl_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
  done
}

cl_down() {
  cl_etcd_stop
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^dmxc-$CL_ID-"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$CL_DIR"
}

cl_etcd_start() {
  cl_spawn sw "$CL_DIR/etcd.log" etcd --data-dir "$CL_DIR/etcd" --name dmxc \
    --listen-client-urls "http://$CL_STORE_ADDR:2379" --advertise-client-urls "http://$CL_STORE_ADDR:2379" \
    --listen-peer-urls "http://127.0.0.1:2380" --initial-advertise-peer-urls "http://127.0.0.1:2380" \
    --initial-cluster "dmxc=http://127.0.0.1:2380" --log-level error --logger zap
  CL_ETCD_PID=$!
  local t
  for (( t = 0; t < 300; t++ )); do
    cl_exec sw etcdctl --endpoints "http://$CL_STORE_ADDR:2379" --dial-timeout 1s endpoint health >/dev/null 2>&1 &&
      return 0
    sleep 0.2
  done
  echo "etcd did not start: $(tail -3 "$CL_DIR/etcd.log")" >&2
  return 1
}

cl_etcd_stop() {
  [[ -n $CL_ETCD_PID ]] || return 0
  kill -9 "$CL_ETCD_PID" 2>/dev/null
  wait "$CL_ETCD_PID" 2>/dev/null
  CL_ETCD_PID=
}

cl_etcdctl() { ETCDCTL_API=3 cl_exec sw etcdctl --endpoints "http://$CL_STORE_ADDR:2379" --dial-timeout 2s "$@"; }
