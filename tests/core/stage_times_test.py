#!/usr/bin/env python3
"""scripts/stage-times.py on synthetic trace files (the layout of src/core/trace.cc and the stage
records of DMX_TRACE_SPAN/DMX_TRACE_AT): spans pair with their adjacent end, the *.ok latencies
pair with their copies' issues in order per stream, only the throughput phase counts, and each
run's GB/s comes from its JSON line. A file cut inside a record (a partial copy) gives the same
table from its whole records and says on stderr what it ignored. Runs without a DMX_TRACE build."""
import json
import os
import random
import subprocess
import sys
import tempfile

from trace_files import REC, ROOT, write


def span(recs, name, sid, tid, t0, ns):
    recs.append((t0, tid, f"{name}+{sid}"))
    recs.append((t0 + ns, tid, f"{name}-{sid}"))


def run(d, cut=0):
    t = 1_000_000
    host = [(t, 9, "bench.throughput")]
    gpu = [(t, 9, "bench.throughput")]
    span(host, "wr", "00000a", 1, t - 500_000, 999_000)  # before the phase: left out
    for i in range(10):
        s = t + 1000 + i * 100_000
        span(host, "wr", "00000a", 1, s, 20_000)
        span(host, "rd", "00000b", 2, s + 1000, 10_000)
        span(host, "bounce", "00000b", 2, s + 12_000, 4_000)
        # Two chunks in flight per round, issued 5 us each, seen done 30 and 40 us after their issue
        # (in order; paired the other way round they would be 20 and 50).
        span(gpu, "d2h", "00000c", 3, s, 5_000)
        span(gpu, "d2h", "00000c", 3, s + 10_000, 5_000)
        gpu.append((s + 35_000, 3, "d2h.ok@00000c"))
        gpu.append((s + 55_000, 3, "d2h.ok@00000c"))
        span(gpu, "d2h.stall", "00000c", 3, s + 20_000, 15_000)  # idle time: not in the thread's busy time
        span(gpu, "wr", "00000c", 3, s + 50_000, 40_000)
        span(gpu, "rd", "00000d", 4, s + 51_000, 10_000)
        span(gpu, "h2d", "00000d", 4, s + 62_000, 3_000)
        gpu.append((s + 72_000, 4, "h2d.ok@00000d"))  # 7 us after its issue
        if i % 2 == 0:
            span(gpu, "slot", "00000d", 4, s + 80_000, 50_000)
    end = t + 1_000_000
    host.append((end, 9, "bench.latency"))
    gpu.append((end, 9, "bench.latency"))
    span(host, "wr", "00000a", 1, end + 10, 999_000)  # the latency phase: left out
    write(os.path.join(d, "stage-host.100"), host)
    write(os.path.join(d, "stage-gpu.200"), gpu)
    for label, gbs, mem in (("host", 21.5, "host"), ("gpu", 17.25, "cuda:0")):
        with open(os.path.join(d, f"stage-{label}.json"), "w") as f:
            f.write(json.dumps({"size_bytes": 256 << 20, "iters": 8, "gb_per_s": gbs, "transport": "tcp",
                                "mem": mem, "peer_mem": mem, "streams": 8, "window": 4}) + "\n")
    if cut:  # random bytes of a record that never finished
        with open(os.path.join(d, "stage-gpu.200"), "ab") as f:
            f.write(random.randbytes(cut))
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "stage-times.py"),
                           "host=" + os.path.join(d, "stage-host"), "gpu=" + os.path.join(d, "stage-gpu")],
                          capture_output=True, text=True, check=True)


def row(out, title):
    """The row's cells per run: [n, p50, p90, total, max/stream, %phase, streams] or ['-']."""
    line = next(x for x in out.splitlines() if x.startswith(title))
    return [c.split() for c in line.split("|")[1:]]


def main():
    with tempfile.TemporaryDirectory() as d:
        out = run(d).stdout
    cut = random.randrange(1, REC.size)
    with tempfile.TemporaryDirectory() as d:
        partial = run(d, cut)
    print(out)
    fails = []

    def check(what, got, want):
        if got != want:
            fails.append(f"{what}: got {got}, want {want}")

    check("host GB/s", "21.50 GB/s" in out and "traced phase 1.0 ms" in out, True)
    check("gpu GB/s", "17.25 GB/s" in out, True)
    check("write", row(out, "tx: socket write"),
          [["10", "20.0", "20.0", "0.2", "0.2", "20.0", "1"], ["10", "40.0", "40.0", "0.4", "0.4", "40.0", "1"]])
    check("read", row(out, "rx: socket read")[0][:4], ["10", "10.0", "10.0", "0.1"])
    check("bounce", row(out, "rx: bounce copy")[0][:2], ["10", "4.0"])
    check("bounce gpu", row(out, "rx: bounce copy")[1], ["-"])
    check("d2h", row(out, "tx: D2H copy issue"), [["-"], ["20", "5.0", "5.0", "0.1", "0.1", "10.0", "1"]])
    check("d2h.ok", row(out, "tx: D2H issued -> done")[1][:4], ["20", "40.0", "40.0", "0.7"])
    check("stall", row(out, "tx: socket idle, waits for D2H")[1][:4], ["10", "15.0", "15.0", "0.1"])
    check("h2d.ok", row(out, "rx: H2D issued -> done")[1][:2], ["10", "7.0"])
    check("slot", row(out, "rx: wait for a staging slot")[1][:4], ["5", "50.0", "50.0", "0.2"])
    check("threads", "1: 0.2 ms (20%)" in out and "4: 0.4 ms (38%)" in out, True)
    check("cut file's table", partial.stdout, out)
    check("cut file said", f"ignored the trailing {cut} bytes" in partial.stderr, True)
    for f in fails:
        print("FAIL", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
