#!/usr/bin/env bash
# The cost of checksum=crc32c: the same `dmx bench --loopback` with and without --checksum crc32c,
# alternating, ROUNDS times per configuration, one JSON row per run in $OUT (default ./checksum-cost).
# Usage: scripts/checksum-cost.sh DMX_BINARY "MEM:TRANSPORT ..." [SIZES] [ROUNDS]
#   e.g. scripts/checksum-cost.sh build/tools/dmx/dmx "host:tcp host:shm cuda:0:tcp cuda:0:cuda_ipc" 256M 3
set -euo pipefail
dmx=${1:?dmx binary}
configs=${2:?"MEM:TRANSPORT ..."}
sizes=${3:-256M}
rounds=${4:-3}
out=${OUT:-./checksum-cost}
mkdir -p "$out"
rows="$out/checksum-cost.jsonl"
: > "$rows"
for cfg in $configs; do
  mem=${cfg%:*}
  transport=${cfg##*:}
  for ((r = 1; r <= rounds; ++r)); do
    for checksum in none crc32c; do
      "$dmx" bench --loopback --mem "$mem" --transport "$transport" --sizes "$sizes" --checksum "$checksum" \
        --verify --json 2> /dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    j = json.loads(line)
    print(json.dumps({"mem": sys.argv[1], "transport": sys.argv[2], "checksum": sys.argv[3], "round": int(sys.argv[4]),
                      "size": j["size_bytes"], "gb_per_s": j["gb_per_s"], "p50_us": j["p50_us"],
                      "verified": j["verified"], "checksum_ok": j.get("checksum_ok"), "path": j["transport"],
                      "error": j.get("error")}))' "$mem" "$transport" "$checksum" "$r" >> "$rows"
    done
  done
done
# Median GB/s per configuration and size, and the cost of the checksum.
python3 - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["mem"], r["transport"], r["size"]) for r in rows}, key=lambda k: (k[0], k[1], k[2]))
print("| memory | transport | size | GB/s without | GB/s with crc32c | cost | checksum_ok |")
print("|---|---|---:|---:|---:|---:|---|")
for mem, tr, size in keys:
    def med(c):
        v = [r["gb_per_s"] for r in rows if (r["mem"], r["transport"], r["size"], r["checksum"]) == (mem, tr, size, c) and not r["error"]]
        return statistics.median(v) if v else float("nan")
    a, b = med("none"), med("crc32c")
    ok = all(r["checksum_ok"] for r in rows if (r["mem"], r["transport"], r["size"], r["checksum"]) == (mem, tr, size, "crc32c"))
    print(f"| {mem} | {tr} | {size} | {a:.2f} | {b:.2f} | {100 * (1 - b / a):.1f} % | {ok} |")
PY
