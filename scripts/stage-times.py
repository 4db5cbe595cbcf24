#!/usr/bin/env python3
"""stage-times.py LABEL=PREFIX... — each stage's time on the throughput path, one table for several runs.

Each PREFIX is the DMX_TRACE_FILE of one `dmx bench --loopback --json` run of a DMX_TRACE build
(the process wrote PREFIX.<pid>); PREFIX.json, when present, holds the bench's JSON line (GB/s).
scripts/stage-times.sh makes the runs. Only the records of the throughput phase are used (from
the `bench.throughput` point to `bench.latency`; the phase's untimed warm-up operation is in it).

The stages are the spans and points of src/stream/stream.cc (src/core/trace.h, DMX_TRACE_SPAN/AT):
  d2h     sender: the chunk's device->host copy issued into its staging slot (CPU time)
  d2h.ok  sender: from issued to seen done by the stream (copy latency, queueing included)
  d2h.stall  sender: nothing to write but the front chunk, whose D2H copy is not done yet (the
          socket idles for the copy)
  wr      sender: one socket write (writev) that moved bytes
  rd      receiver: one socket read that moved bytes
  bounce  receiver: a host chunk's copy from the read buffer into its destination
  slot    receiver: no free receive staging slot, blocked on a host->device copy
  h2d     receiver: the chunk's host->device copy issued from its slot (CPU time)
  h2d.ok  receiver: from issued to seen done (copy latency)
Per stage: how often, p50 and p90 of one occurrence, the total over all streams, the busiest
stream's total and its share of the phase's wall time. The *.ok rows are latencies that overlap
other work (in flight while the stream writes or reads), not busy time; d2h.stall is a stream's
idle time. Last: each worker
thread's time in all spans, the busiest thread's share of the phase.
"""
import collections
import json
import os
import re
import statistics
import sys

import trace_records

NAMED = re.compile(r"^(.+)([+@-])([0-9a-f]{6})$")
STAGES = [
    ("d2h", "tx: D2H copy issue"),
    ("d2h.ok", "tx: D2H issued -> done (lat)"),
    ("d2h.stall", "tx: socket idle, waits for D2H"),
    ("wr", "tx: socket write"),
    ("rd", "rx: socket read"),
    ("bounce", "rx: bounce copy (host)"),
    ("slot", "rx: wait for a staging slot"),
    ("h2d", "rx: H2D copy issue"),
    ("h2d.ok", "rx: H2D issued -> done (lat)"),
]
LATENCY = {"d2h.ok": "d2h", "h2d.ok": "h2d"}  # point -> the span whose end it follows, FIFO per stream


def load(path):
    """Records in file (append) order: (ns, tid, name)."""
    return trace_records.read(path, "stage-times")


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0


def analyse(paths):
    """-> (phase ns, {stage: [(stream, tid, start, ns)]}, notes)"""
    notes = []
    recs = []
    for p in paths:
        r = load(p)
        if len(r) >= (1 << 20) - 2:  # trace.cc's kRecords: the later records were dropped
            notes.append(f"{p} is full: the phase may be cut short (lower STAGES_ITERS)")
        recs += r
    marks = sorted((ns, name) for ns, _, name in recs if name.startswith("bench."))
    begin = next((ns for ns, n in marks if n == "bench.throughput"), None)
    end = next((ns for ns, n in marks if n == "bench.latency" and begin is not None and ns > begin), None)
    if begin is None or end is None:
        notes.append("no bench.throughput/bench.latency points: all records used")
        begin = min((r[0] for r in recs), default=0)
        end = max((r[0] for r in recs), default=0)
    stages = collections.defaultdict(list)
    issued = collections.defaultdict(collections.deque)  # (span, stream) -> issue end times
    # Spans are two adjacent records: "<name>+<id>" then "<name>-<id>" of one thread.
    for i, (ns, tid, name) in enumerate(recs):
        m = NAMED.match(name)
        if not m:
            continue
        stage, mark, sid = m.groups()
        if mark == "+":
            if i + 1 < len(recs) and recs[i + 1][2] == f"{stage}-{sid}" and recs[i + 1][1] == tid:
                t1 = recs[i + 1][0]
                if stage in LATENCY.values():
                    issued[(stage, sid)].append(t1)
                if begin <= ns and t1 <= end:
                    stages[stage].append((sid, tid, ns, t1 - ns))
        elif mark == "@" and stage in LATENCY:
            q = issued[(LATENCY[stage], sid)]
            if q:  # in issue order (one copy queue per stream and device)
                t0 = q.popleft()
                if begin <= t0 and ns <= end:
                    stages[stage].append((sid, tid, t0, ns - t0))
    if sum(len(v) for v in stages.values()) == 0:
        notes.append("no stage records in the phase: a trace build with the stage points of src/stream/stream.cc?")
    return end - begin, stages, notes


def main():
    runs = []
    for a in sys.argv[1:]:
        if "=" not in a:
            print(__doc__)
            return 2
        label, prefix = a.split("=", 1)
        d = os.path.dirname(prefix) or "."
        base = os.path.basename(prefix)
        paths = [os.path.join(d, f) for f in sorted(os.listdir(d))
                 if f.startswith(base + ".") and f[len(base) + 1:].isdigit()] if os.path.isdir(d) else []
        bench = {}
        if os.path.isfile(prefix + ".json"):
            for line in open(prefix + ".json"):
                line = line.strip()
                if line.startswith("{"):
                    bench = json.loads(line)
        runs.append((label, paths, bench))
    if not runs:
        print(__doc__)
        return 2
    results = []
    rc = 0
    for label, paths, bench in runs:
        if not paths:
            print(f"{label}: no trace file (was dmx built with -DDMX_TRACE=ON, and did the bench run?)")
            rc = 1
            results.append((label, bench, 0, {}, []))
            continue
        phase, stages, notes = analyse(paths)
        results.append((label, bench, phase, stages, notes))

    for label, bench, phase, stages, notes in results:
        gbs = bench.get("gb_per_s")
        ops = bench.get("iters")
        print(f"{label}: {bench.get('mem', '?')} -> {bench.get('peer_mem', '?')} over {bench.get('transport', '?')}, "
              f"{bench.get('streams', '?')} streams, {bench.get('size_bytes', 0) / 2**20:.0f} MiB x {ops} "
              f"(window {bench.get('window', '?')}): {gbs if gbs is None else f'{gbs:.2f}'} GB/s; "
              f"traced phase {phase / 1e6:.1f} ms (warm-up op included)")
        for n in notes:
            print(f"  note: {n}")
    print()
    w = 64
    head = f"{'stage':31}"
    for label, *_ in results:
        head += f" | {label[:w]:^{w}}"
    print(head)
    sub = f"{'':31}"
    for _ in results:
        sub += f" | {'n':>7} {'p50 us':>8} {'p90 us':>8} {'total ms':>9} {'max/strm ms':>11} {'%phase':>6} {'strms':>5}"
    print(sub)
    print("-" * len(sub))
    for stage, title in STAGES:
        line = f"{title:31}"
        for _, _, phase, stages, _ in results:
            v = stages.get(stage, [])
            if not v:
                line += f" | {'-':>7} {'':>8} {'':>8} {'':>9} {'':>11} {'':>6} {'':>5}"
                continue
            d = [x[3] for x in v]
            per = collections.Counter()
            for sid, _, _, ns in v:
                per[sid] += ns
            top = max(per.values())
            line += (f" | {len(d):7d} {pct(d, .5) / 1e3:8.1f} {pct(d, .9) / 1e3:8.1f} {sum(d) / 1e6:9.1f}"
                     f" {top / 1e6:11.1f} {100 * top / phase if phase else 0:6.1f} {len(per):5d}")
        print(line)
    print()
    print("worker threads: time in spans (d2h, wr, rd, bounce, slot, h2d), the busiest first")
    for label, _, phase, stages, _ in results:
        per = collections.Counter()
        for stage, v in stages.items():
            if stage in LATENCY or stage == "d2h.stall":
                continue
            for _, tid, _, ns in v:
                per[tid] += ns
        tops = ", ".join(f"{tid}: {ns / 1e6:.1f} ms ({100 * ns / phase if phase else 0:.0f}%)"
                         for tid, ns in per.most_common(10))
        print(f"  {label}: {tops or '-'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
