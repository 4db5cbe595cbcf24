#!/usr/bin/env python3
"""bench/plot.py on a small dmx bench --json file and a compare.py record: both PNGs appear, and
input without result rows fails. Runs plot.py with the first interpreter that has matplotlib
(this one, else /usr/bin/python3, Debian's python3-matplotlib); exit 77 (ctest: skipped) if none."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "bench", "plot.py")


def python_with_matplotlib():
    for exe in (sys.executable, "/usr/bin/python3"):
        if exe and os.path.exists(exe) and subprocess.run(
                [exe, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            return exe
    return None


def dmx_row(transport, size, gbps, p50):
    return {"size_bytes": size, "iters": 1000, "gb_per_s": gbps, "msg_per_s": gbps * 1e9 / size,
            "p50_us": p50, "p99_us": p50 * 2, "p999_us": p50 * 3, "transport": transport,
            "reason": "test", "cpu_pct": 100.0, "mem": "host", "peer_mem": "host", "streams": 8}


def main():
    py = python_with_matplotlib()
    if py is None:
        print("SKIPPED: not installed: python3 with matplotlib (Debian: python3-matplotlib)")
        return 77
    with tempfile.TemporaryDirectory() as d:
        rows = os.path.join(d, "rows.jsonl")
        with open(rows, "w") as f:
            f.write("# dmx bench: a text line to skip\n")
            for t in ("tcp", "shm"):
                for i, size in enumerate((8, 4096, 1 << 20)):
                    f.write(json.dumps(dmx_row(t, size, 0.01 * 10 ** i, 20.0 + i * 50)) + "\n")
        record = os.path.join(d, "record.json")
        with open(record, "w") as f:
            json.dump({"scenario": "gpu-staged", "dmx": [],
                       "refs": [{"ref": "nccl-socket", "size_bytes": 8, "gb_per_s": 0.001, "lat_p50_us": 16},
                                {"ref": "nccl-socket", "size_bytes": 1 << 20, "gb_per_s": 2.5, "lat_p50_us": 400},
                                {"ref": "nccl-socket", "metric": "half_rtt", "size_bytes": 8, "gb_per_s": 0},
                                {"ref": "iperf3", "streams": 4, "gb_per_s": 3.3}]}, f)
        prefix = os.path.join(d, "out")
        p = subprocess.run([py, PLOT, rows, record, "-o", prefix, "--title", "test"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        for name in ("out_gbps.png", "out_p50.png"):
            path = os.path.join(d, name)
            assert path in p.stdout, p.stdout
            with open(path, "rb") as fh:
                assert fh.read(8) == b"\x89PNG\r\n\x1a\n", name
        empty = os.path.join(d, "empty.jsonl")
        with open(empty, "w") as f:
            f.write("not json\n")
        p = subprocess.run([py, PLOT, empty, "-o", prefix], capture_output=True, text=True)
        assert p.returncode == 2 and "no result rows" in p.stderr, (p.returncode, p.stderr)
        p = subprocess.run([py, PLOT, "--help"], capture_output=True, text=True)
        assert p.returncode == 0 and "PREFIX_gbps.png" in p.stdout, p.stdout
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
