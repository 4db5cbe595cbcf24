#!/usr/bin/env python3
"""Side-by-side latencies from tagged `dmx bench --json` lines (scripts/bench-pair.sh).

    latency_table.py FILE KEY [KEY ...]

Groups the JSON lines of FILE by the values of the KEYs (e.g. `size_bytes mode`) and prints one
row per group: the p50 half round trips in file order (the rounds), the message rates of the
windowed part of each run (thousands of messages per second, from gb_per_s and size_bytes), the
chunks the cuda_ipc small-chunk lane moved in each, and whether every run was verified.
"""
import collections
import json
import sys


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    keys = argv[2:]
    rows = collections.defaultdict(list)
    with open(argv[1]) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            lane = sum(p.get("chunks_inline", 0) for p in j.get("paths", []))
            size = j.get("size_bytes") or 0
            rate = j.get("gb_per_s", 0) * 1e9 / size / 1e3 if size else 0.0
            p50 = j["p50_us"] if "p50_us" in j else j["lat_p50_us"]  # older dmx (ab-latency.sh runs one)
            rows[tuple(j.get(k) for k in keys)].append((p50, lane, j.get("verified", False), rate))
    order = lambda kv: tuple((0, x, "") if isinstance(x, (int, float)) else (1, 0, str(x)) for x in kv[0])
    for group, runs in sorted(rows.items(), key=order):
        label = " ".join(f"{k}={v}" for k, v in zip(keys, group))
        print(f"{label:<28} p50 half RTT us: " + ", ".join(f"{r[0]:.2f}" for r in runs) +
              "; k msg/s: " + ", ".join(f"{r[3]:.0f}" for r in runs) +
              f"  (lane chunks {[r[1] for r in runs]}, verified {all(r[2] for r in runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
