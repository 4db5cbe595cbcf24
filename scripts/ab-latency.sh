#!/usr/bin/env bash
# ab-latency.sh — 8-byte half round trips of two dmx trees side by side, alternated, on this machine.
#
#   mkdir ab-old && git archive OLD_REV | tar -x -C ab-old     (untracked: the device tool carries it)
#   bash scripts/ab-latency.sh ab-old                          (from the repository root)
#
# Builds `dmx` (CUDA on when nvcc is found) from OLD_DIR and from the working tree, each into its own
# build-ab/, then runs `dmx bench --listen` / `--connect --transport ${AB_TRANSPORT:-tcp} --sizes
# ${AB_SIZES:-8} --streams ${AB_STREAMS:-1} --iters ${AB_ITERS:-5000} --verify` host->host and, with a
# GPU, cuda:0->cuda:1 (cuda:0 with one), new and old alternated for AB_ROUNDS (3) rounds. Results:
# $OUT/ab.jsonl (every row, gb_per_s included) and a latency summary line per case.
# Throughput of large sizes: AB_SIZES=16M,256M AB_STREAMS=8 AB_ITERS= (empty: dmx bench's own counts).
set -u
OLD=${1:?usage: ab-latency.sh OLD_DIR}
R=$(pwd)
OUT=${OUT:-$R/ab-latency-out}
mkdir -p "$OUT"
[[ "$OLD" = /* ]] || OLD="$R/$OLD"
build() {  # build DIR NAME
  cmake -S "$1" -B "$1/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMX_BUILD_TESTS=OFF \
    -DDMX_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/ab-build-$2.log" 2>&1 &&
    cmake --build "$1/build-ab" --target dmx -j "$(( $(nproc) / 2 + 1 ))" >> "$OUT/ab-build-$2.log" 2>&1
}
build "$OLD" old & p1=$!
build "$R" new & p2=$!
if ! wait $p1 || ! wait $p2; then
  echo "ab-latency: a build failed; see $OUT/ab-build-*.log" >&2
  exit 1
fi
cases=(host)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[[ ${gpus:-0} -ge 1 ]] && cases+=(gpu)
peer=cuda:1
[[ ${gpus:-0} -lt 2 ]] && peer=cuda:0
# shellcheck source=scripts/bench-pair.sh
source "$R/scripts/bench-pair.sh"
iters=${AB_ITERS-5000}  # empty: dmx bench chooses the counts
port=7900
for ((round = 1; round <= ${AB_ROUNDS:-3}; round++)); do
  for v in new old; do
    D=$R/build-ab/tools/dmx/dmx
    [[ $v == old ]] && D=$OLD/build-ab/tools/dmx/dmx
    for c in "${cases[@]}"; do
      args=(--mem host --peer-mem host)
      [[ $c == gpu ]] && args=(--mem cuda:0 --peer-mem "$peer")
      port=$((port + 1))
      bench_pair "$OUT/ab.jsonl" "\"v\":\"$v\",\"case\":\"$c\"," "$D" "$port" --transport "${AB_TRANSPORT:-tcp}" \
        "${args[@]}" --sizes "${AB_SIZES:-8}" --streams "${AB_STREAMS:-1}" ${iters:+--iters "$iters"} \
        --verify > /dev/null
    done
  done
done
python3 "$R/bench/latency_table.py" "$OUT/ab.jsonl" case v
