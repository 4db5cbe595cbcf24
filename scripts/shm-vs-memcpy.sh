#!/usr/bin/env bash
# shm host -> host against single-thread memcpy, side by side, N rounds (issue 17).
#
#   scripts/shm-vs-memcpy.sh [-b BUILD] [-o OLD_BUILD] [-n ROUNDS] [-s SIZES] [-r "SLOT:SLOTS ..."]
#                            [-e "VAR=VALUE[,VAR=VALUE] ..."] [-j OUT.jsonl]
#
# Each round runs, one after the other on an otherwise idle machine:
#   - bench/ref/memcpy_host.py: single-thread memcpy, warm destination (compare.py's reference);
#   - BUILD/bench/shm_bench: the shm link alone, two processes, with its own memcpy reference
#     measured in the same process, and where each side's time went (busy = copying); one
#     measurement of ~4 GiB per size (--rounds 1), as dmx bench makes one: the medians below then
#     compare like with like (a best of three against one run flattered the link);
#   - BUILD/tools/dmx/dmx bench --listen/--connect, host -> host, --transport shm (the engine);
#   - the same two from OLD_BUILD when given (a build of the base commit), at its own defaults,
#     right after the new ones in every round (A/B in the same minutes);
#   - with -r, the new binaries again at each ring shape (DMX_SHM_SLOT_SIZE / DMX_SHM_SLOTS);
#   - with -e, the new binaries again with each set of settings (e.g. DMX_SHM_COPY_THREADS=1).
# Prints one table at the end; -j also keeps every row as JSON lines.
# Defaults: BUILD=build, ROUNDS=3, SIZES=1M,16M,256M.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=build OLD="" N=3 SIZES=1M,16M,256M SHAPES="" SETS="" JSON=""
while getopts "b:o:n:s:r:e:j:h" o; do
  case $o in
    b) B=$OPTARG ;; o) OLD=$OPTARG ;; n) N=$OPTARG ;; s) SIZES=$OPTARG ;; r) SHAPES=$OPTARG ;; e) SETS=$OPTARG ;;
    j) JSON=$OPTARG ;; *) sed -n '2,17p' "$0"; exit 2 ;;
  esac
done
for f in "$B/bench/shm_bench" "$B/tools/dmx/dmx"; do [[ -x $f ]] || { echo "missing $f (ninja -C $B shm_bench dmx)" >&2; exit 2; }; done
[[ -z $OLD ]] || for f in "$OLD/bench/shm_bench" "$OLD/tools/dmx/dmx"; do [[ -x $f ]] || { echo "missing $f" >&2; exit 2; }; done
ROWS=$(mktemp)
trap 'rm -f "$ROWS"' EXIT
bytes() { python3 -c "import sys; sys.path.insert(0, '$ROOT/bench/ref'); import refutil; print(refutil.parse_size('$1'))"; }
MIN=$(bytes "${SIZES%%,*}") MAX=$(bytes "${SIZES##*,}")

# emit ROUND WHAT BUILD RING: stdin JSON lines -> rows
emit() {
  python3 -c '
import json, sys
rnd, what, build, ring = sys.argv[1:5]
for line in sys.stdin:
    if not line.startswith("{"): continue
    d = json.loads(line)
    if d.get("ref") == "memcpy-host":
        row = dict(size=d["size_bytes"], gbps=d["gb_per_s"])
    elif d.get("bench") == "shm.host_to_host":
        row = dict(size=d["size"], gbps=d["shm_GBps"], memcpy=d["memcpy_1thread_GBps"],
                   ring="%dK x %d" % (d["slot_size"] >> 10, d["slots"]),
                   busy="tx %.2f rx %.2f" % (d["tx_busy"], d["rx_busy"]) if "tx_busy" in d else "")
    elif "gb_per_s" in d and "size_bytes" in d:
        row = dict(size=d["size_bytes"], gbps=d["gb_per_s"], transport=d.get("transport"),
                   ring=(d.get("paths") or [{}])[0].get("detail", ""), verified=d.get("verified"))
    else:
        continue
    row.update(round=int(rnd), what=what, build=build)
    row.setdefault("ring", ring)
    print(json.dumps(row))
' "$@" >>"$ROWS"
}

PORT=$((20000 + $$ % 20000))
dmx_pair() {  # BIN [env...]: dmx bench over shm, host -> host
  local bin=$1 l
  shift
  PORT=$((PORT + 1))
  env "$@" "$bin" bench --listen "tcp://127.0.0.1:$PORT" >/dev/null 2>&1 &
  l=$!
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  env "$@" timeout 300 "$bin" bench --connect "tcp://127.0.0.1:$PORT" --mem host --peer-mem host --transport shm \
    --streams 1 --sizes "$SIZES" --verify --json || echo "dmx bench failed ($bin)" >&2
  kill "$l" 2>/dev/null || true
  wait "$l" 2>/dev/null || true
}

for r in $(seq "$N"); do
  echo "round $r/$N" >&2
  python3 "$ROOT/bench/ref/memcpy_host.py" --sizes "$SIZES" | emit "$r" memcpy_host.py - -
  "$B/bench/shm_bench" --min-size "$MIN" --max-size "$MAX" --rounds 1 | emit "$r" "shm_bench" new default
  dmx_pair "$B/tools/dmx/dmx" | emit "$r" "dmx bench" new default
  if [[ -n $OLD ]]; then
    "$OLD/bench/shm_bench" --min-size "$MIN" --max-size "$MAX" --rounds 1 | emit "$r" "shm_bench" old default
    dmx_pair "$OLD/tools/dmx/dmx" | emit "$r" "dmx bench" old default
  fi
  for shape in $SHAPES; do
    env DMX_SHM_SLOT_SIZE="${shape%%:*}" DMX_SHM_SLOTS="${shape##*:}" "$B/bench/shm_bench" --min-size "$MIN" \
      --max-size "$MAX" --rounds 1 | emit "$r" "shm_bench" new "$shape"
    dmx_pair "$B/tools/dmx/dmx" DMX_SHM_SLOT_SIZE="${shape%%:*}" DMX_SHM_SLOTS="${shape##*:}" |
      emit "$r" "dmx bench" new "$shape"
  done
  for set in $SETS; do
    IFS=, read -ra vars <<<"$set"
    env "${vars[@]}" "$B/bench/shm_bench" --min-size "$MIN" --max-size "$MAX" --rounds 1 |
      emit "$r" "shm_bench $set" new default
    dmx_pair "$B/tools/dmx/dmx" "${vars[@]}" | emit "$r" "dmx bench $set" new default
  done
done

[[ -z $JSON ]] || cp "$ROWS" "$JSON"
python3 - "$ROWS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = {}  # (round, size) -> memcpy_host.py best GB/s
for r in rows:
    if r["what"] == "memcpy_host.py":
        ref[(r["round"], r["size"])] = r["gbps"]
def mib(n): return "%gM" % (n / 2**20) if n >= 2**20 else "%gK" % (n / 1024)
print("| round | what | build | ring | size | GB/s | memcpy GB/s (memcpy_host.py) | ratio | shm_bench's memcpy | ratio to it | busy |")
print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|")
groups = {}
for r in rows:
    if r["what"] == "memcpy_host.py": continue
    m = ref.get((r["round"], r["size"]))
    ratio = r["gbps"] / m if m else None
    own = r.get("memcpy")
    print("| %d | %s | %s | %s | %s | %.2f | %s | %s | %s | %s | %s |" % (
        r["round"], r["what"], r["build"], r["ring"], mib(r["size"]), r["gbps"], "%.2f" % m if m else "-",
        "%.3f" % ratio if ratio else "-", "%.2f" % own if own else "", "%.3f" % (r["gbps"] / own) if own else "",
        r.get("busy", "")))
    if ratio: groups.setdefault((r["what"], r["build"], r["ring"], r["size"]), []).append(ratio)
print("\nmedian ratio to memcpy_host.py over the rounds:")
print("| what | build | ring | size | median | min | max |")
print("|---|---|---|---:|---:|---:|---:|")
for (what, build, ring, size), v in sorted(groups.items(), key=lambda kv: (kv[0][3], kv[0][0], kv[0][1], kv[0][2])):
    print("| %s | %s | %s | %s | %.3f | %.3f | %.3f |" % (what, build, ring, mib(size), statistics.median(v), min(v), max(v)))
EOF
