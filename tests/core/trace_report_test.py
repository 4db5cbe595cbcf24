#!/usr/bin/env python3
"""scripts/trace-report.py on two synthetic trace files (the layout of src/core/trace.cc): the
merged view must follow the points across both processes in time order with the right p50, and
the per-thread view must pair each thread's own points. A file cut short inside a record (a partial
copy) gives the same report from its whole records and says on stderr how many trailing bytes it
ignored. Runs without a DMX_TRACE build."""
import os
import random
import subprocess
import sys
import tempfile

from trace_files import REC, ROOT, write


def report(*paths):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "trace-report.py"), *paths],
                          capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as d:
        a, b = [], []
        t = 1_000_000
        for i in range(100):  # ping: A sends (1.0 us), B receives 2.5 us later, B answers after 0.5 us
            a.append((t, 11, "send.post"))
            a.append((t + 1000, 12, "s0.out.eager"))
            b.append((t + 3500, 21, "s0.in.eager"))
            b.append((t + 4000, 22, "op.completed"))
            t += 10_000
        write(os.path.join(d, "t.100"), a)
        write(os.path.join(d, "t.200"), b)
        r = report(os.path.join(d, "t.100"), os.path.join(d, "t.200"))
        print(r.stdout, r.stderr)
        if r.returncode != 0:
            print(f"trace-report exited {r.returncode}")
            return 1
        expect = [
            "400 records from 2 file(s)",
            "100     1.00     1.00  send.post@100/11 -> s0.out.eager@100/12",
            "100     2.50     2.50  s0.out.eager@100/12 -> s0.in.eager@200/21",
            "100     0.50     0.50  s0.in.eager@200/21 -> op.completed@200/22",
            "99     6.00     6.00  op.completed@200/22 -> send.post@100/11",
            "99    10.00    10.00  send.post@100/11 -> send.post@100/11",
        ]
        missing = [e for e in expect if e not in r.stdout]
        if missing:
            print("missing lines:", *missing, sep="\n  ")
            return 1

        # B's file cut short inside a record: random bytes of a record that never finished.
        rng = random.Random()
        cut = rng.randrange(1, REC.size)
        with open(os.path.join(d, "t.200"), "ab") as f:
            f.write(rng.randbytes(cut))
        r = report(os.path.join(d, "t.100"), os.path.join(d, "t.200"))
        print(r.stdout, r.stderr)
        if r.returncode != 0:
            print(f"trace-report exited {r.returncode} on a file cut {cut} bytes into a record")
            return 1
        missing = [e for e in expect if e not in r.stdout]
        whole = 1 + len(b) + 4  # record 0, B's records, the unwritten tail
        said = f"not a multiple of the {REC.size}-byte record: read {whole} records, ignored the trailing {cut} bytes"
        if missing or said not in r.stderr:
            print("cut file: missing lines:", *missing, *([] if said in r.stderr else ["stderr: " + said]),
                  sep="\n  ")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
