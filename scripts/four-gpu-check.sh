#!/usr/bin/env bash
# four-gpu-check.sh — issue 46, item 2, on a machine with four GPUs, in one call of under 8 minutes:
# the NVLink topology, every GPU sending to every other at once (dmx over cuda_ipc beside
# cudaMemcpyPeer, bench/all_pairs_bench.cc), and the collectives through the NCCL plugin with four
# ranks beside NCCL socket in the same run (bench/ref/nccl_collectives.py --ranks 4).
#
#   bash scripts/four-gpu-check.sh
#
# Settings (environment): B build folder (build-gpu), FOUR_GPU_SKIP_BUILD=1 to use it as it is,
# FOUR_GPU_RANKS (4), FOUR_GPU_MODES (socket,dmx,dmx+NCCL_BUFFSIZE=8388608), FOUR_GPU_SIZES
# (16M,256M,1G), FOUR_GPU_PAIRS_SIZE (256M), FOUR_GPU_PAIRS_ITERS (8).
# Results under $OUT (default four-gpu-out): topo.txt, all-pairs.jsonl, collectives.jsonl,
# nccl-logs/, and the log of each step. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 ...).
set -u
OUT=${OUT:-$PWD/four-gpu-out}
mkdir -p "$OUT"
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=${B:-build-gpu}
PY=$(command -v python3)
RANKS=${FOUR_GPU_RANKS:-4}
step() { printf '\n==== %s ==== %s\n' "$1" "$(date -u +%H:%M:%S)"; }
rc=0

step topology
nvidia-smi -L | tee "$OUT/gpus.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
cat "$OUT/topo.txt"
git log -1 --format='commit %h %s' | tee "$OUT/commit.txt"

if [[ -z "${FOUR_GPU_SKIP_BUILD:-}" ]]; then
  step build
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
    > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  timeout 240 cmake --build "$B" -j "$(nproc)" --target dmx_nccl_plugin all_pairs_bench > "$OUT/build.log" 2>&1 ||
    { grep -B3 -A15 "error" "$OUT/build.log" | head -60; exit 1; }
fi

step "all pairs at once: dmx over cuda_ipc vs cudaMemcpyPeer"
timeout 150 "$B/bench/all_pairs_bench" --gpus "$RANKS" --size "${FOUR_GPU_PAIRS_SIZE:-256M}" \
  --iters "${FOUR_GPU_PAIRS_ITERS:-8}" > "$OUT/all-pairs.jsonl" 2> "$OUT/all-pairs.stderr" || rc=1
grep -E "aggregate|dmx_over|error|skipped" "$OUT/all-pairs.jsonl"
tail -5 "$OUT/all-pairs.stderr"

step "collectives, $RANKS ranks: the plugin vs NCCL socket"
timeout 330 "$PY" bench/ref/nccl_collectives.py --plugin-dir "$B/lib" --ranks "$RANKS" \
  --modes "${FOUR_GPU_MODES:-socket,dmx,dmx+NCCL_BUFFSIZE=8388608}" --sizes "${FOUR_GPU_SIZES:-16M,256M,1G}" \
  --iters 5 --warmup 2 --timeout 150 --keep-logs "$OUT/nccl-logs" > "$OUT/collectives.jsonl" || rc=1
"$PY" - "$OUT/collectives.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    if "error" in r or "skipped" in r:
        print(r)
bw = {(r["mode"], r["op"], r["size_bytes"]): r["busbw_gb_per_s"] for r in rows if "busbw_gb_per_s" in r}
modes = sorted({m for m, _, _ in bw}, key=lambda m: (m != "socket", m))
print("op          size  " + "  ".join(f"{m[:28]:>28}" for m in modes))
for op, size in sorted({(o, s) for _, o, s in bw}, key=lambda k: (k[0], k[1])):
    base = bw.get(("socket", op, size))
    cells = []
    for m in modes:
        v = bw.get((m, op, size))
        cells.append(f"{'-' if v is None else f'{v:.2f}'}" + (f" ({v / base:.2f}x)" if v and base and m != "socket" else ""))
    print(f"{op:<10} {size >> 20:>5}M  " + "  ".join(f"{c:>28}" for c in cells))
EOF
step done
exit $rc
