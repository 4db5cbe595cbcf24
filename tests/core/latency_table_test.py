#!/usr/bin/env python3
"""bench/latency_table.py on synthetic tagged `dmx bench --json` lines: groups by the given keys in
numeric order, keeps each group's runs in file order, gives each run's message rate, counts the
cuda_ipc lane's chunks, and says
"verified False" when any run of a group was not verified."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def row(mode, size, p50, lane=0, verified=True, key="p50_us"):
    return json.dumps({"mode": mode, "size_bytes": size, key: p50, "verified": verified,
                       "gb_per_s": size * 50e3 / 1e9,
                       "paths": [{"name": "shm", "chunks_inline": 0}, {"name": "cuda_ipc", "chunks_inline": lane}]})


def main():
    lines = [row("on", 4096, 12.5, 1999), row("off", 8, 14.25, key="lat_p50_us"), "not json: a progress line",
             row("on", 8, 12.0, 999), row("off", 8, 15.5, 0, verified=False), row("on", 8, 11.75, 998)]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "latency_table.py"), f.name, "size_bytes",
                              "mode"], capture_output=True, text=True, check=True).stdout.splitlines()
    finally:
        os.unlink(f.name)
    print("\n".join(out))
    assert len(out) == 3, out
    assert out[0].startswith("size_bytes=8 mode=off") and "14.25, 15.50" in out[0] and "verified False" in out[0], out
    assert out[1].startswith("size_bytes=8 mode=on") and "12.00, 11.75" in out[1], out
    assert "k msg/s: 50, 50" in out[1], out
    assert "lane chunks [999, 998]" in out[1] and "verified True" in out[1], out
    assert out[2].startswith("size_bytes=4096 mode=on") and "lane chunks [1999]" in out[2], out
    print("ok")


if __name__ == "__main__":
    main()
