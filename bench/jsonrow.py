#!/usr/bin/env python3
"""Prints dmx bench --json lines as one compact row each, labelled with argv[1].

Rows from dmx before the p50_us rename carry lat_p50_us instead."""
import json
import sys

label = sys.argv[1] if len(sys.argv) > 1 else ""
for line in sys.stdin:
    j = json.loads(line)
    err = j.get("error", "")
    print(f"{label:34s} {j['mem']:>7s}->{j['peer_mem']:<7s} {j['size_bytes']:>10d} {j['gb_per_s']:7.2f} GB/s"
          f"  p50 {j.get('p50_us', j.get('lat_p50_us')):8.1f} us  cpu {j['cpu_pct']:4.0f}% {err}")
