#!/usr/bin/env bash
# host-speed-ab.sh — issue 46, items 4 and 5: host TCP and shm against their references, for the
# commit before and this tree, side by side in one call (builds, then two rounds of about 75 s on
# 16-32 idle CPUs: our estimate, not yet timed there).
#
#   mkdir ab-old && git archive 6b614b1 | tar -x -C ab-old   (on the repo's machine: the device tool
#                                                             carries the untracked directory)
#   bash scripts/host-speed-ab.sh [OLD_DIR]                   (from the repository root; default ab-old,
#                                                             made by git archive when .git is here)
#
# Builds `dmx` (CUDA off: host paths only) from OLD_DIR into build-hs-old/ and from the working tree
# into build-hs/ (both ignored by git), and `tcp_ref` from the working tree, in parallel. Then
# HS_ROUNDS (2) rounds, each:
#   references  bench/ref/iperf3.sh --streams 1 and 8 (if iperf3 is installed; else said once);
#               tcp_ref N SIZE WINDOW 2 cold|bounce at 1 and 8 streams, 1 MiB (window 64) and
#               256 MiB (window 4): kernel TCP moving the memory dmx bench moves, its best mode is
#               the reference; bench/ref/memcpy_host.py 1M,256M (single-thread memcpy into one
#               destination: the issue's reference; and, as memcpy_window, into dmx bench's
#               window of destinations, 64 at 1 MiB and 4 at 256 MiB);
#   dmx         tcp: dmx bench --loopback --mem host --transport tcp --streams 1|8 --sizes 1M,256M;
#               shm: dmx bench --listen/--connect (two processes) --transport shm --sizes 1M,256M
#               --verify; for old, new, and new with DMX_NT_RECEIVE_MIN=4M (the old threshold of
#               non-temporal receives: what that one change does), the order rotating by round.
# Results under $OUT (default host-speed-out): rows.jsonl (every measurement), table.md (medians of
# the rounds: GB/s and the ratios the issue names), build logs. Nothing else is touched.
# HS_NEW_BUILD / HS_OLD_BUILD: build directories already built (dmx, and tcp_ref in the new one)
# to use instead of building; HS_BUILD_ONLY=1: build, then stop (a second call measures, given the
# same trees: HS_NEW_BUILD=build-hs HS_OLD_BUILD=build-hs-old); HS_ROUNDS: rounds (default 2).
set -u
R=$(pwd)
OUT=${OUT:-$R/host-speed-out}
OLD=${1:-ab-old}
ROUNDS=${HS_ROUNDS:-2}
mkdir -p "$OUT"
[[ "$OLD" = /* ]] || OLD="$R/$OLD"
T0=$(date +%s)
say() { printf '[%4ds] %s\n' $(($(date +%s) - T0)) "$*"; }

if [[ -z ${HS_OLD_BUILD:-} && ! -f "$OLD/CMakeLists.txt" ]]; then
  if git -C "$R" rev-parse --verify -q 6b614b1 > /dev/null; then
    mkdir -p "$OLD" && git -C "$R" archive 6b614b1 | tar -x -C "$OLD"
  else
    echo "host-speed-ab: no $OLD and no git here: mkdir ab-old && git archive 6b614b1 | tar -x -C ab-old" >&2
    exit 2
  fi
fi

NB=${HS_NEW_BUILD:-$R/build-hs} OB=${HS_OLD_BUILD:-$R/build-hs-old}
JOBS=$(( $(nproc) / 2 + 1 ))
build() {  # build SRC DIR NAME TARGETS...
  local src=$1 dir=$2 name=$3
  shift 3
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMX_ENABLE_CUDA=OFF \
    -DDMX_BUILD_TESTS=OFF > "$OUT/build-$name.log" 2>&1 &&
    cmake --build "$dir" -j "$JOBS" --target "$@" >> "$OUT/build-$name.log" 2>&1
}
say "building (CUDA off):${HS_OLD_BUILD:+ not} $OLD,${HS_NEW_BUILD:+ not} $R"
ok=1
if [[ -z ${HS_OLD_BUILD:-} ]]; then build "$OLD" "$OB" old dmx & p1=$!; fi
if [[ -z ${HS_NEW_BUILD:-} ]]; then build "$R" "$NB" new dmx tcp_ref & p2=$!; fi
[[ -z ${p1:-} ]] || wait "$p1" || ok=0
[[ -z ${p2:-} ]] || wait "$p2" || ok=0
if [[ $ok = 0 ]]; then
  echo "host-speed-ab: a build failed; see $OUT/build-*.log" >&2
  tail -20 "$OUT"/build-*.log >&2
  exit 1
fi
NEW_DMX=$NB/tools/dmx/dmx OLD_DMX=$OB/tools/dmx/dmx TCP_REF=$NB/bench/tcp_ref
say "built"
[[ -z ${HS_BUILD_ONLY:-} ]] || exit 0

ROWS=$OUT/rows.jsonl
: > "$ROWS"
row() { echo "$1" >> "$ROWS"; }  # one JSON object
have_iperf=1
command -v iperf3 > /dev/null 2>&1 || { have_iperf=0; say "iperf3 is not installed: no iperf3 columns (scripts/install-deps.sh installs it)"; }

# dmx_tcp ROUND BUILD BIN STREAMS [VAR=VALUE...]: one row per size
dmx_tcp() {
  local rnd=$1 build=$2 bin=$3 n=$4
  shift 4
  env "$@" timeout 120 "$bin" bench --loopback --mem host --transport tcp --streams "$n" --sizes 1M,256M --json \
    2> "$OUT/last-dmx.err" | python3 -c '
import json, sys
rnd, build, n = sys.argv[1:4]
for l in sys.stdin:
    if l.startswith("{"):
        d = json.loads(l)
        print(json.dumps(dict(round=int(rnd), build=build, what="dmx", path="tcp", streams=int(n), size=d["size_bytes"],
                              gbps=d["gb_per_s"], p50_us=d.get("p50_us"))))' "$rnd" "$build" "$n" >> "$ROWS" ||
    say "dmx tcp $build $n streams failed: $(tail -2 "$OUT/last-dmx.err")"
}
PORT=$((21000 + $$ % 20000))
# dmx_shm ROUND BUILD BIN [VAR=VALUE...]
dmx_shm() {
  local rnd=$1 build=$2 bin=$3 srv
  shift 3
  PORT=$((PORT + 1))
  env "$@" "$bin" bench --listen "tcp://127.0.0.1:$PORT" > /dev/null 2>&1 &
  srv=$!
  for _ in $(seq 50); do (exec 3<> "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && break; sleep 0.1; done
  env "$@" timeout 120 "$bin" bench --connect "tcp://127.0.0.1:$PORT" --mem host --peer-mem host --transport shm \
    --streams 1 --sizes 1M,256M --verify --json 2> "$OUT/last-dmx.err" | python3 -c '
import json, sys
rnd, build = sys.argv[1:3]
for l in sys.stdin:
    if l.startswith("{"):
        d = json.loads(l)
        print(json.dumps(dict(round=int(rnd), build=build, what="dmx", path="shm", streams=1, size=d["size_bytes"],
                              gbps=d["gb_per_s"], p50_us=d.get("p50_us"), verified=d.get("verified"))))' "$rnd" "$build" \
    >> "$ROWS" || say "dmx shm $build failed: $(tail -2 "$OUT/last-dmx.err")"
  kill "$srv" 2> /dev/null
  wait "$srv" 2> /dev/null
}

for ((r = 1; r <= ROUNDS; r++)); do
  say "round $r/$ROUNDS: references"
  if [[ $have_iperf = 1 ]]; then
    for n in 1 8; do
      g=$(bash "$R/bench/ref/iperf3.sh" --streams "$n" --time 2 2> /dev/null |
        python3 -c 'import json,sys; print(next((json.loads(l)["gb_per_s"] for l in sys.stdin if "gb_per_s" in l), ""))')
      [[ -n $g ]] && row "{\"round\":$r,\"what\":\"iperf3\",\"streams\":$n,\"gbps\":$g}"
    done
  fi
  for n in 1 8; do
    for spec in 1048576:64 268435456:4; do
      for mode in cold bounce; do
        g=$(timeout 30 "$TCP_REF" "$n" "${spec%:*}" "${spec#*:}" 2 "$mode" | awk '{print $NF}')
        [[ -n $g ]] && row "{\"round\":$r,\"what\":\"tcp_ref\",\"mode\":\"$mode\",\"streams\":$n,\"size\":${spec%:*},\"gbps\":$g}"
      done
    done
  done
  for w in 1 64; do  # one destination (the issue's reference), and dmx bench's window of them
    python3 "$R/bench/ref/memcpy_host.py" --sizes 1M,256M --window $w | python3 -c '
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    what = "memcpy" if sys.argv[2] == "1" else "memcpy_window"
    print(json.dumps(dict(round=int(sys.argv[1]), what=what, size=d["size_bytes"], gbps=d["gb_per_s"])))' "$r" $w >> "$ROWS"
  done
  order=(old new new-nt4M)
  (( r % 2 == 0 )) && order=(new-nt4M new old)
  for b in "${order[@]}"; do
    say "round $r/$ROUNDS: dmx $b"
    case $b in
      old) bin=$OLD_DMX env=() ;;
      new) bin=$NEW_DMX env=() ;;
      new-nt4M) bin=$NEW_DMX env=(DMX_NT_RECEIVE_MIN=4M) ;;
    esac
    for n in 1 8; do dmx_tcp "$r" "$b" "$bin" "$n" "${env[@]}"; done
    dmx_shm "$r" "$b" "$bin" "${env[@]}"
  done
done
say "done; table:"

python3 - "$ROWS" "${HS_OLD_BUILD:-$OLD}" > "$OUT/table.md" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds = sorted({r["round"] for r in rows})
def ref(what, rnd, **k):
    v = [r["gbps"] for r in rows if r["what"] == what and r["round"] == rnd and all(r.get(a) == b for a, b in k.items())]
    return max(v) if v else None
def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None
def f(x, d=2):
    return "-" if x is None else ("%." + str(d) + "f") % x
def mib(n): return "%dM" % (n >> 20)
builds = [b for b in ("old", "new", "new-nt4M") if any(r.get("build") == b for r in rows)]
print("Medians over %d rounds (per round: dmx / its reference of the same round). tcp_ref: the better of cold and"
      " bounce in that round. old = %s, new = this tree, new-nt4M = this tree with DMX_NT_RECEIVE_MIN=4M.\n"
      % (len(rounds), sys.argv[2]))
print("| case | reference | ref GB/s | " + " | ".join("%s GB/s | %s ratio" % (b, b) for b in builds) + " | target |")
print("|---|---|---:|" + "---:|---:|" * len(builds) + "---|")
cases = [("tcp", 8, 1 << 20, "tcp_ref", "≥ 0.95"), ("tcp", 8, 256 << 20, "tcp_ref", "≥ 0.95"),
         ("tcp", 1, 1 << 20, "iperf3", "≥ 0.9"), ("tcp", 1, 256 << 20, "iperf3", "≥ 0.9"),
         ("tcp", 1, 1 << 20, "tcp_ref", ""), ("tcp", 1, 256 << 20, "tcp_ref", ""),
         ("tcp", 8, 1 << 20, "iperf3", ""), ("tcp", 8, 256 << 20, "iperf3", ""),
         ("shm", 1, 1 << 20, "memcpy", "≥ 0.8"), ("shm", 1, 256 << 20, "memcpy", ""),
         ("shm", 1, 1 << 20, "memcpy_window", ""), ("shm", 1, 256 << 20, "memcpy_window", "")]
for path, n, size, rname, target in cases:
    def refv(rnd):
        if rname == "tcp_ref": return ref("tcp_ref", rnd, streams=n, size=size)
        if rname == "iperf3": return ref("iperf3", rnd, streams=n)
        return ref(rname, rnd, size=size)
    refs = [refv(rnd) for rnd in rounds]
    if all(x is None for x in refs):
        continue
    cells = []
    for b in builds:
        g, q = [], []
        for rnd, rv in zip(rounds, refs):
            v = [r["gbps"] for r in rows if r.get("build") == b and r["round"] == rnd and r["path"] == path
                 and r["streams"] == n and r["size"] == size]
            if v:
                g.append(v[0])
                if rv: q.append(v[0] / rv)
        cells.append("%s | %s" % (f(med(g)), f(med(q))))
    label = "%s %d × %s" % (path, n, mib(size))
    print("| %s | %s | %s | %s | %s |" % (label, rname, f(med(refs)), " | ".join(cells), target))
print("\nLatency of one message alone (dmx bench's half round trip p50, µs, median of rounds):\n")
print("| case | " + " | ".join(builds) + " |")
print("|---|" + "---:|" * len(builds))
for path, n in (("tcp", 1), ("tcp", 8), ("shm", 1)):
    for size in (1 << 20,):
        cells = [f(med([r.get("p50_us") for r in rows if r.get("build") == b and r.get("path") == path
                        and r.get("streams") == n and r.get("size") == size]), 1) for b in builds]
        print("| %s %d × %s | %s |" % (path, n, mib(size), " | ".join(cells)))
bad = [r for r in rows if r.get("path") == "shm" and r.get("verified") is False]
print("\nshm rows verified: %s" % ("all" if not bad else "NOT %d of them" % len(bad)))
print("\nEvery row: rows.jsonl (iperf3, tcp_ref per mode, memcpy, dmx per build and round).")
EOF
cat "$OUT/table.md"
say "total"
