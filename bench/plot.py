#!/usr/bin/env python3
"""Plots dmx bench results: GB/s vs size and p50 latency vs size, log-log, as PNG files.

  bench/plot.py FILE [FILE ...] [-o PREFIX] [--title TEXT]

Each FILE is either JSON lines (`dmx bench --json` output, or a reference script's output such as
bench/ref/nccl_socket.py) or the record `bench/compare.py --json FILE` writes (its "dmx" and "refs"
rows are plotted). Lines that are not JSON objects are skipped, and so are rows without a size
(iperf3's single rate is drawn as a horizontal line instead), `"metric"` rows (half round trips),
and rows with `skipped` or `error`.

One line per system: the label is a row's `system`, else its `ref` (reference rows), else
`dmx <transport>`, else the file name; when rows of one label differ in mem, peer_mem, streams or
op, those are added to the label. Latency is `p50_us` (`lat_p50_us` in reference rows and in
rows of dmx before the rename). Writes PREFIX_gbps.png and PREFIX_p50.png (default PREFIX: plot)
and prints their paths. Needs matplotlib (Debian: python3-matplotlib); draws with the Agg
backend, no display. Exit: 0 written, 2 nothing to plot or unreadable input, 3 no matplotlib.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import refutil  # noqa: E402

SPLIT_FIELDS = ("mem", "peer_mem", "streams", "op")


def read_rows(path):
    """The result rows of one file, each with `_file` set."""
    with open(path) as fh:
        text = fh.read()
    rows = []
    try:  # a compare.py record: one JSON object holding row lists
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and ("dmx" in whole or "refs" in whole):
        rows = list(whole.get("dmx") or []) + list(whole.get("refs") or [])
    elif isinstance(whole, dict):
        rows = [whole]
    else:
        rows = refutil.json_lines(text)
    stem = os.path.splitext(os.path.basename(path))[0]
    out = []
    for r in rows:
        if not isinstance(r, dict) or r.get("metric") or r.get("skipped") or r.get("error"):
            continue
        if not isinstance(r.get("gb_per_s"), (int, float)):
            continue
        r = dict(r, _file=stem)
        out.append(r)
    return out


def base_label(r):
    if r.get("system"):
        return str(r["system"])
    if r.get("ref"):
        return str(r["ref"])
    if r.get("transport"):
        return f"dmx {r['transport']}"
    return r["_file"]


def group(rows):
    """{label: [rows]}: one line each (see the module's doc for the label)."""
    by_base = collections.defaultdict(list)
    for r in rows:
        by_base[base_label(r)].append(r)
    out = collections.defaultdict(list)
    for base, rs in by_base.items():
        varying = [f for f in SPLIT_FIELDS if len({str(r.get(f)) for r in rs}) > 1]
        files = {r["_file"] for r in rs}
        for r in rs:
            parts = [base] + [f"{f}={r.get(f)}" for f in varying]
            if len(files) > 1:
                parts.append(f"({r['_file']})")
            out[" ".join(parts)].append(r)
    return out


def latency(r):
    v = r.get("p50_us", r.get("lat_p50_us"))
    return v if isinstance(v, (int, float)) and v > 0 else None


def size_label(n, _pos=None):
    return refutil.format_size(int(n)) if n >= 1 and n == int(n) else f"{n:g}"


def draw(plt, ticker, lines, flat, metric, ylabel, path, title):
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = 0
    for label, rs in sorted(lines.items()):
        pts = sorted((int(r["size_bytes"]), metric(r)) for r in rs)
        pts = [(x, y) for x, y in pts if x > 0 and y is not None and y > 0]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
            drawn += 1
    for label, value in flat:
        ax.axhline(value, linestyle="--", linewidth=1, color="gray")
        ax.annotate(label, xy=(0.99, value), xycoords=("axes fraction", "data"), fontsize=7,
                    color="gray", ha="right", va="bottom")
        drawn += 1
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(size_label))
    ax.set_xlabel("message size (bytes, binary: 1K = 1024)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", linewidth=0.3)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__[__doc__.index("Each FILE"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="JSON-lines or compare.py --json files")
    p.add_argument("-o", "--output", default="plot", metavar="PREFIX",
                   help="write PREFIX_gbps.png and PREFIX_p50.png (default: plot)")
    p.add_argument("--title", help="title over both plots")
    args = p.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError as e:
        print(f"plot.py: matplotlib is needed ({e}); Debian: apt install python3-matplotlib "
              f"(this is {sys.executable})", file=sys.stderr)
        return 3
    rows = []
    for f in args.files:
        try:
            rows += read_rows(f)
        except OSError as e:
            print(f"plot.py: {f}: {e}", file=sys.stderr)
            return 2
    sized = [r for r in rows if isinstance(r.get("size_bytes"), (int, float))]
    # A rate without a size (iperf3: a stream of 128 KiB writes) is a level, not a curve.
    flat = [(f"{base_label(r)} x{r.get('streams', '?')}", r["gb_per_s"]) for r in rows
            if "size_bytes" not in r and r["gb_per_s"] > 0]
    if not sized and not flat:
        print("plot.py: no result rows (size_bytes and gb_per_s) in " + ", ".join(args.files),
              file=sys.stderr)
        return 2
    lines = group(sized)
    written = []
    gbps, p50 = f"{args.output}_gbps.png", f"{args.output}_p50.png"
    if draw(plt, ticker, lines, flat, lambda r: r.get("gb_per_s"), "GB/s (1e9 bytes/s)", gbps, args.title):
        written.append(gbps)
    if draw(plt, ticker, lines, [], latency, "p50 latency (us)", p50, args.title):
        written.append(p50)
    for w in written:
        print(w)
    return 0 if written else 2


if __name__ == "__main__":
    sys.exit(main())
