#!/usr/bin/env python3
"""trace-report.py FILE... — where a ping-pong's microseconds go, from a DMX_TRACE build.

Run both sides of a benchmark with DMX_TRACE_FILE=/some/prefix (each process writes
/some/prefix.<pid>), then: python3 scripts/trace-report.py /some/prefix.*

Prints, for every pair of points that follow each other often enough (merged across processes
in time order, and per thread), the count and the p50 / p90 of the time between them in
microseconds. The merged view follows the critical path of a ping-pong, where one thing happens
at a time; the per-thread view says what each thread spends between its own points.
"""
import collections
import os
import re
import sys

import trace_records

STAGE = re.compile(r"[+@-][0-9a-f]{6}$")


def load(path):
    pid = path.rsplit(".", 1)[-1]
    # Not the per-stream stage records of scripts/stage-times.py.
    return [(ns, f"{pid}/{tid}", name) for ns, tid, name in trace_records.read(path, "trace-report")
            if not STAGE.search(name)]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(title, pairs, min_count):
    rows = [(k, v) for k, v in pairs.items() if len(v) >= min_count]
    rows.sort(key=lambda kv: -len(kv[1]))
    print(f"\n{title}")
    print(f"  {'count':>7} {'p50 us':>8} {'p90 us':>8}  transition")
    for (a, b), v in rows:
        print(f"  {len(v):7d} {pct(v, 0.5) / 1e3:8.2f} {pct(v, 0.9) / 1e3:8.2f}  {a} -> {b}")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    events = []
    for p in sys.argv[1:]:
        if os.path.getsize(p) > 0:
            events += load(p)
    events.sort()
    if not events:
        print("no trace records")
        return 1
    names = collections.Counter(e[2] for e in events)
    min_count = max(10, max(names.values()) // 10)
    merged = collections.defaultdict(list)
    for x, y in zip(events, events[1:]):
        merged[(f"{x[2]}@{x[1]}", f"{y[2]}@{y[1]}")].append(y[0] - x[0])
    per_thread = collections.defaultdict(list)
    last = {}
    for ns, th, name in events:
        if th in last:
            per_thread[(f"{last[th][1]}@{th}", f"{name}@{th}")].append(ns - last[th][0])
        last[th] = (ns, name)
    print(f"{len(events)} records from {len(sys.argv) - 1} file(s); points: " +
          ", ".join(f"{n} x{c}" for n, c in names.most_common()))
    report("merged, in time order (the critical path of a ping-pong):", merged, min_count)
    report("per thread:", per_thread, min_count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
