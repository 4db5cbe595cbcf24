#!/usr/bin/env bash
# The store across "hosts": 3 network namespaces on one switch and Debian's etcd beside them,
# one dmx process per namespace. Publish and look up (dmx ls), connect by name with verified
# transfers, a peer killed and restarted (its partner fails fast naming it; the name finds the new
# epoch), the store killed (established transfers go on, lookups fail naming it) and restarted
# (found again), a forged entry and a stale one (refused, each with its reason).
# Prints "SKIPPED: reason" and exits 0 where namespaces or etcd are missing.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DMX=${DMX_BIN:-$ROOT/build/tools/dmx/dmx}
source "$ROOT/tests/netns/cluster_lib.sh"
why=$(cl_skip); [[ -z $why ]] || { echo "SKIPPED: $why"; exit 0; }
command -v etcd >/dev/null && command -v etcdctl >/dev/null ||
  { echo "SKIPPED: no etcd/etcdctl (apt-get install etcd-server etcd-client)"; exit 0; }
[[ -x $DMX ]] || { echo "FAIL: no dmx binary at $DMX"; exit 1; }
trap cl_down EXIT
cl_up 3 || { echo "FAIL: could not make the namespaces"; exit 1; }
cl_etcd_start || { echo "FAIL: etcd"; exit 1; }
KEY=cluster-netns-test-key-0123456789
export DMX_AUTH_KEY=$KEY DMX_LOG_LEVEL=warn DMX_STORE=$CL_STORE DMX_STORE_JOB=nt DMX_CONNECT_RETRY_REFUSED=true
export DMX_STORE_LEASE_TTL=3s DMX_STORE_WATCH_INTERVAL=300ms
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

serve() {  # host index: serve as w<i> on its address
  DMX_STORE_NAME=w$1 cl_spawn "$1" "$CL_DIR/w$1.log" "$DMX" bench --listen "tcp://$(cl_addr "$1"):7400"
  eval "SERVER_$1=$!"
}
epoch_of() { cl_exec 0 "$DMX" ls --json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin); print(next((p['epoch'] for p in d['peers'] if p['name']=='$1'), 0))"; }
wait_epoch() {  # name, an epoch it must differ from: waits until the store shows another one
  local t e
  for (( t = 0; t < 300; t++ )); do
    e=$(epoch_of "$1"); [[ $e != 0 && $e != "$2" ]] && { echo "$e"; return 0; }; sleep 0.2
  done
  echo 0; return 1
}
verified() {  # host, target name, then bench arguments: every row must say verified
  local h=$1 name=$2; shift 2
  local out rows badrows
  out=$(timeout 120 env -u DMX_STORE_NAME ip netns exec "$(cl_ns "$h")" "$DMX" bench --connect "dmx://nt/$name" \
        --verify --json "$@" 2>&1)
  local rc=$?
  rows=$(grep -c '"size_bytes"' <<< "$out"); badrows=$(grep '"size_bytes"' <<< "$out" | grep -vc '"verified":true')
  [[ $rc -eq 0 && $rows -gt 0 && $badrows -eq 0 ]] || { echo "$out" | tail -3; return 1; }
}

serve 1; serve 2
e1=$(wait_epoch w1 0) && e2=$(wait_epoch w2 0) || bad "w1/w2 never appeared in the store"
ls_out=$(cl_exec 0 "$DMX" ls 2>&1)
grep -q "w1 .*epoch $e1" <<< "$ls_out" && grep -q "w2 .*epoch $e2" <<< "$ls_out" &&
  ok "dmx ls shows w1 (epoch $e1) and w2 (epoch $e2)" || { bad "dmx ls: $ls_out"; }
verified 0 w1 --sizes 1,4097,16777219 --iters 3 && verified 0 w2 --op write --sizes 1,4097,16777219 --iters 3 &&
  ok "connect by name: verified send and write to w1 and w2" || bad "verified transfers by name"

# A peer killed mid-transfer and restarted: the partner fails fast naming it; the name finds the new epoch.
( timeout 90 env -u DMX_STORE_NAME ip netns exec "$(cl_ns 0)" "$DMX" bench --connect dmx://nt/w1 --sizes 64M \
    --iters 100000 > "$CL_DIR/long.log" 2>&1; echo "exit $?" >> "$CL_DIR/long.log" ) &
long=$!
sleep 2
kill -9 "$SERVER_1"; start=$(date +%s)
serve 1
wait $long; took=$(( $(date +%s) - start ))
if grep -q "exit 0" "$CL_DIR/long.log" || [[ $took -gt 20 ]] || ! grep -q "$(cl_addr 1)\|dmx://nt/w1" "$CL_DIR/long.log"; then
  bad "w1 killed: the partner did not fail promptly naming it (${took}s): $(tail -2 "$CL_DIR/long.log")"
else
  ok "w1 killed: the partner failed in ${took}s: $(grep -m1 -o 'peer failed[^]]*]' "$CL_DIR/long.log")"
fi
n1=$(wait_epoch w1 "$e1") && verified 0 w1 --sizes 4097,1048577 --iters 2 &&
  ok "w1 restarted as epoch $n1 (was $e1): found by name, verified" || bad "the restarted w1 was not found ($n1)"

# The store killed: established transfers go on, lookups fail naming it; restarted: found again.
( timeout 120 env -u DMX_STORE_NAME ip netns exec "$(cl_ns 0)" "$DMX" bench --connect dmx://nt/w2 --verify --json \
    --sizes 16M --iters 40 > "$CL_DIR/through.log" 2>&1; echo "exit $?" >> "$CL_DIR/through.log" ) &
through=$!
sleep 3
cl_etcd_stop
lsdown=$(cl_exec 0 "$DMX" ls 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "unavailable: etcd http://$CL_STORE_ADDR:2379" <<< "$lsdown" &&
  ok "store down: dmx ls fails naming it" || bad "store down: dmx ls said ($rc): $lsdown"
wait $through
grep -q "exit 0" "$CL_DIR/through.log" && ! grep '"size_bytes"' "$CL_DIR/through.log" | grep -qv '"verified":true' &&
  ok "store down: the established endpoint finished its verified transfers" ||
  bad "store down: the established endpoint failed: $(tail -2 "$CL_DIR/through.log")"
cl_etcd_start || bad "etcd restart"
sleep 1
e2b=$(epoch_of w2)
[[ $e2b == "$e2" ]] && verified 0 w2 --sizes 4097 --iters 2 &&
  ok "store back: w2 found again, same epoch $e2" || bad "store back: w2 epoch '$e2b' (was $e2)"

# A forged entry (signed with another key) and a stale one (signed, but naming w1 at w2's address).
sign() { printf '%s' "$1" | openssl dgst -sha256 -hmac "$2" | awk '{print $NF}'; }
forged='{"addresses":["tcp://'$(cl_addr 2)':7400"],"epoch":1,"host":"x","job":"nt","kind":"peer","name":"evil","pid":1,"transports":["tcp"]}'
cl_etcdctl put dmx/nt/peers/evil "${forged%\}},\"sig\":\"$(sign "$forged" not-the-key)\"}" >/dev/null
stale='{"addresses":["tcp://'$(cl_addr 2)':7400"],"epoch":'$n1',"host":"x","job":"nt","kind":"peer","name":"ghost","pid":1,"transports":["tcp"]}'
cl_etcdctl put dmx/nt/peers/ghost "${stale%\}},\"sig\":\"$(sign "$stale" "$KEY")\"}" >/dev/null
out=$(env -u DMX_STORE_NAME ip netns exec "$(cl_ns 0)" "$DMX" bench --connect dmx://nt/evil --sizes 1 --iters 1 2>&1)
grep -q "signature does not match" <<< "$out" && ok "forged entry refused: $(grep -o 'store entry[^[]*' <<< "$out" | head -1)" ||
  bad "forged entry: $out"
out=$(env -u DMX_STORE_NAME ip netns exec "$(cl_ns 0)" "$DMX" bench --connect dmx://nt/ghost --sizes 1 --iters 1 2>&1)
grep -q "authentication failed.*the process at" <<< "$out" && ok "stale entry refused in the handshake" ||
  bad "stale entry: $out"
grep -q "refused (1)" <<< "$(cl_exec 0 "$DMX" ls 2>&1)" && ok "dmx ls lists the forged entry as refused" ||
  bad "dmx ls did not list the refused entry"

[[ $fail -eq 0 ]] && echo "PASS" || echo "FAIL"
exit $fail
