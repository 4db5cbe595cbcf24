#!/usr/bin/env bash
# Self-test of the benchmark references and bench/compare.py on a machine without GPUs,
# using the test doubles in this folder (fake dmx bench, fake torch). It checks control flow,
# skip paths, error paths and output shape, not performance. Runs in about a minute.
#   bench/ref/testing/selftest.sh        # PASS / FAIL per check, exit 1 if any failed
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
cd "$ROOT" || exit 1
PY=${PYTHON:-python3}
FAKE_DMX=$HERE/fake_dmx.py
FAKE_TORCH=$HERE/fake_torch
failures=0
tmp=$(mktemp -d /tmp/dmx-ref-selftest.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

check() {  # name command... ; passes when the command exits 0
  local name=$1 t0=$SECONDS; shift
  rm -f "$tmp/x"
  if "$@" >"$tmp/out" 2>&1; then
    echo "PASS  $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL  $name"; cat "$tmp/out" "$tmp/x" 2>/dev/null | tail -n 15 | sed 's/^/      /'
    failures=$((failures + 1))
  fi
}
expect_rc() {  # rc command... ; passes when the command exits with rc
  local want=$1; shift
  "$@"; local rc=$?
  [ "$rc" -eq "$want" ] || { echo "exit $rc, wanted $want"; return 1; }
}
has() { grep -q -- "$1" "$2" || { echo "no '$1' in output:"; cat "$2"; return 1; }; }

# -- syntax
check "py_compile" "$PY" -m py_compile bench/compare.py bench/ref/refutil.py bench/ref/nccl_socket.py \
  bench/ref/memcpy_peer.py bench/ref/testing/fake_dmx.py
if command -v shellcheck >/dev/null 2>&1; then
  check "shellcheck" shellcheck bench/ref/iperf3.sh scripts/netns.sh scripts/latency-trace.sh tests/netns/smoke.sh bench/ref/testing/selftest.sh
fi

# -- refutil
check "refutil sizes" "$PY" -c '
import sys; sys.path.insert(0, "bench/ref"); import refutil as r
assert r.parse_sizes("8,4K,1M,256M,1GiB") == [8, 4096, 1 << 20, 256 << 20, 1 << 30]
assert r.format_size(256 << 20) == "256M" and r.format_size(8) == "8"
assert r.percentile([1, 2, 3, 4], 50) == 2 and r.percentile([5], 99) == 5
for bad in ("1X", "", "-1"):
    try: r.parse_sizes(bad); raise SystemExit(f"accepted {bad!r}")
    except ValueError: pass'

# -- memcpy_host.py: one destination, or a window of them capped at 1 GiB as dmx bench's
check "memcpy_host.py --window" bash -c "
  $PY bench/ref/memcpy_host.py --sizes 4K,1M --iters 1 --window 3 > $tmp/w.json &&
  [ \$(grep -c '\"window\": 3}' $tmp/w.json) -eq 2 ] &&
  $PY bench/ref/memcpy_host.py --sizes 4K --iters 1 | grep -q '\"window\": 1}' &&
  $PY bench/ref/memcpy_host.py --sizes 512M --iters 1 --window 64 | grep -q '\"window\": 2}' &&
  ! $PY bench/ref/memcpy_host.py --window 65 2> $tmp/x && grep -q 'must be 1-64' $tmp/x"

# -- GPU references without torch: skip lines, exit 0
no_torch() { env -u PYTHONPATH "$PY" -I "$@"; }  # -I: no user site, so no stray torch
check "nccl_socket.py skips without torch" bash -c "$(declare -f no_torch); PY=$PY; no_torch bench/ref/nccl_socket.py > $tmp/s.json && grep -q '\"skipped\"' $tmp/s.json && [ \$(wc -l < $tmp/s.json) -eq 3 ]"
check "nccl_collectives.py modes: settings and +apart" "$PY" -c '
import sys; sys.path.insert(0, "bench/ref")
import nccl_collectives as n
assert n.mode_parts("dmx+apart+NCCL_MIN_NCHANNELS=8") == ("dmx", {"apart": "", "NCCL_MIN_NCHANNELS": "8"})
assert n.mode_parts("socket") == ("socket", {})
for bad in ("dmx+foo", "nccl+NCCL_X=1"):
    try:
        n.parse_args(["--modes", bad]); sys.exit(f"{bad} accepted")
    except SystemExit as e:
        assert e.code == 2, e.code
'
check "memcpy_peer.py skips without torch" bash -c "$(declare -f no_torch); PY=$PY; no_torch bench/ref/memcpy_peer.py > $tmp/m.json && grep -q '\"skipped\"' $tmp/m.json"

# -- GPU references with the fake torch: control flow and output fields
export PYTHONPATH=$FAKE_TORCH
check "nccl_socket.py (fake torch) all modes" bash -c "
  $PY bench/ref/nccl_socket.py --sizes 8,4K --iters 2 --warmup 1 --rtt-iters 3 > $tmp/n.json &&
  [ \$(grep -c '\"gb_per_s\"' $tmp/n.json) -eq 6 ] && [ \$(grep -c '\"half_rtt\"' $tmp/n.json) -eq 3 ] &&
  grep -q 'NET/Socket' $tmp/n.json && grep -q '\"NCCL_NVLS_ENABLE\": \"0\"' $tmp/n.json &&
  grep -q '\"TORCH_SYMM_MEM_DISABLE_MULTICAST\": \"1\"' $tmp/n.json && grep -q 'NCCL_NSOCKS_PERTHREAD' $tmp/n.json"
check "nccl_socket.py flags a silent transport fallback" bash -c "
  FAKE_NCCL_VIA=P2P/CUMEM/read $PY bench/ref/nccl_socket.py --socket --sizes 8 --iters 1 --rtt-iters 2 > $tmp/f.json;
  [ \$? -eq 1 ] && grep -q 'did not use the socket transport' $tmp/f.json"
check "nccl_socket.py reports a worker failure" bash -c "
  FAKE_TORCH_INIT_FAIL=1 $PY bench/ref/nccl_socket.py --p2p --sizes 8 > $tmp/e.json; [ \$? -eq 1 ] && grep -q 'rank 0 exited 1' $tmp/e.json"
check "nccl_socket.py bounded on a hang" bash -c "
  FAKE_TORCH_HANG=1 timeout 30 $PY bench/ref/nccl_socket.py --p2p --sizes 8 --timeout 3 > $tmp/h.json; [ \$? -eq 1 ] && grep -q 'timed out' $tmp/h.json"
check "nccl_socket.py skips on 1 GPU" bash -c "
  FAKE_TORCH_GPUS=1 $PY bench/ref/nccl_socket.py > $tmp/g.json && grep -q 'needs 2 GPUs, found 1' $tmp/g.json"
check "memcpy_peer.py (fake torch)" bash -c "
  $PY bench/ref/memcpy_peer.py --sizes 4K --iters 2 --warmup 1 > $tmp/p.json;
  grep -q '\"method\": \"torch.copy_\"' $tmp/p.json && grep -q 'h2d-pinned' $tmp/p.json && grep -q 'd2h-pageable' $tmp/p.json"
check "memcpy_peer.py on 1 GPU skips peer only" bash -c "
  FAKE_TORCH_GPUS=1 $PY bench/ref/memcpy_peer.py --sizes 4K --iters 2 > $tmp/q.json;
  grep -q 'needs GPUs 0 and 1' $tmp/q.json && grep -q '\"ref\": \"h2d-pinned\", \"size_bytes\"' $tmp/q.json"

# -- compare.py against the fake dmx
export DMX_BIN=$FAKE_DMX
check "compare host-loopback PASS" expect_rc 0 env FAKE_DMX_RATE=50 "$PY" bench/compare.py host-loopback --streams 1,2 --time 1 --json "$tmp/c.json"
check "compare JSON record" "$PY" -c "
import json; d = json.load(open('$tmp/c.json'))
assert d['status'] == 'PASS' and len(d['table']) == 4 and len(d['targets']) == 4, d
assert d['refs'][0]['ref'] == 'iperf3' and d['commands']
assert all('--transport tcp' in c for c in d['commands'] if ' bench ' in c), d['commands']"
check "compare host-loopback refuses another transport" bash -c "
  $PY bench/compare.py host-loopback --transport shm --streams 1 > $tmp/x 2>&1; [ \$? -eq 2 ] && grep -q 'runs --transport tcp' $tmp/x"
check "compare host-loopback two-process" expect_rc 0 env FAKE_DMX_RATE=50 "$PY" bench/compare.py host-loopback --two-process --streams 1 --time 1
check "compare FAIL below target" bash -c "FAKE_DMX_RATE=0.01 $PY bench/compare.py host-loopback --streams 1 --time 1 > $tmp/x 2>&1; [ \$? -eq 1 ] && grep -q FAIL $tmp/x"
check "compare dmx bench not built" bash -c "FAKE_DMX_FAIL=1 $PY bench/compare.py host-loopback --streams 1 --time 1 > $tmp/x 2>&1; [ \$? -eq 2 ] && grep -q 'not built yet' $tmp/x"
check "compare listener fails" bash -c "FAKE_DMX_LISTEN_FAIL=1 $PY bench/compare.py host-loopback --two-process --streams 1 --time 1 > $tmp/x 2>&1; [ \$? -eq 2 ] && grep -q 'before listening' $tmp/x"
check "compare dmx missing" bash -c "$PY bench/compare.py host-loopback --dmx /nonexistent/dmx > $tmp/x 2>&1; [ \$? -eq 2 ] && grep -q 'dmx not found' $tmp/x"
check "compare gpu-staged (fake dmx, fake torch)" bash -c "
  FAKE_DMX_RATE=1000 $PY bench/compare.py gpu-staged --sizes 8,1M,4M --large 4M --streams 4 --json $tmp/g.json > $tmp/x 2>&1;
  [ \$? -eq 0 ] && grep -q 'gpu-staged: PASS' $tmp/x && grep -q 'dmx field p50_us' $tmp/x"
check "compare gpu-staged catches a transport fallback" bash -c "
  FAKE_DMX_RATE=8 FAKE_DMX_TRANSPORT=shm $PY bench/compare.py gpu-staged --sizes 8,1M,4M --large 4M --streams 1 > $tmp/x 2>&1;
  [ \$? -eq 1 ] && grep -q 'FAIL  x1 dmx transport is tcp' $tmp/x"
check "compare same-host (fake)" bash -c "
  FAKE_DMX_RATE=1000 $PY bench/compare.py same-host --sizes 1M,4M --large 4M --same-host-target 0.1 > $tmp/x 2>&1; [ \$? -eq 0 ] && grep -q 'same-host: PASS' $tmp/x"
check "compare gpu-staged SKIPPED on 1 GPU" bash -c "
  FAKE_TORCH_GPUS=1 $PY bench/compare.py gpu-staged > $tmp/x 2>&1; [ \$? -eq 0 ] && grep -q 'SKIPPED' $tmp/x &&
  FAKE_TORCH_GPUS=1 $PY bench/compare.py gpu-staged --fail-on-skip > /dev/null 2>&1; [ \$? -eq 3 ]"
unset PYTHONPATH

# -- the real dmx bench, when given (rates on a shared VM mean nothing: only the plumbing is judged)
if [ -n "${DMX_REAL_BIN:-}" ]; then
  check "compare host-loopback --two-process (real dmx: $DMX_REAL_BIN)" bash -c "
    DMX_BIN=$DMX_REAL_BIN $PY bench/compare.py host-loopback --two-process --streams 1 --sizes 1M --time 1 --verify > $tmp/x 2>&1;
    rc=\$?; [ \$rc -le 1 ] && grep -q 'host-loopback: \(PASS\|FAIL\)' $tmp/x && grep -q ' True\$' $tmp/x"
else
  echo "SKIP  real dmx checks (set DMX_REAL_BIN=path/to/dmx)"
fi

# -- real iperf3 and namespaces (root only)
if command -v iperf3 >/dev/null 2>&1; then
  check "iperf3.sh loopback" bash -c "bench/ref/iperf3.sh --streams 1,2 --time 1 > $tmp/i.json &&
    [ \$(grep -c '\"gb_per_s\": [0-9]' $tmp/i.json) -eq 2 ] && grep -q '\"threads\"' $tmp/i.json"
fi
if [ "$(id -u)" -eq 0 ]; then
  check "netns smoke" bash -c "tests/netns/smoke.sh | tee $tmp/smoke | tail -n1 | grep -q PASS"
  check "compare host-netns (fake dmx)" expect_rc 0 env FAKE_DMX_RATE=50 "$PY" bench/compare.py host-netns --streams 1 --time 1
  check "no namespaces left" bash -c "! ip netns list | grep -q '^dmx-test-\(smoke\|cmp\|iperf\)'"
else
  echo "SKIP  netns checks (not root)"
fi

[ "$failures" -eq 0 ] && echo "selftest: PASS" || echo "selftest: $failures FAILED"
[ "$failures" -eq 0 ]
