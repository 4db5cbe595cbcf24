#!/usr/bin/env python3
"""Test double for `dmx bench`, used only to test bench/compare.py before (or without) the
real one: speaks the same command line and prints the same JSON fields, with made-up rates.

  fake_dmx.py bench --loopback|--listen ADDR|--connect ADDR [--mem K] [--peer-mem K]
                    [--streams N] [--sizes ...] [--transport T] [--json] ...

--listen really listens on ADDR until SIGINT/SIGTERM; --connect really connects to it (so a
missing listener fails as it would). Behaviour knobs (environment):
  FAKE_DMX_RATE      GB/s of a host->host transfer per stream (default 1.0)
  FAKE_DMX_GPU_RATE  GB/s of a cuda->cuda transfer per stream (default 0.9 x RATE)
  FAKE_DMX_FAIL      exit 2 with "dmx bench: not built yet" (like the placeholder)
  FAKE_DMX_LISTEN_FAIL  the listener exits 1 at once
  FAKE_DMX_HALF_RTT  if set, rows carry half_rtt_us with this value
  FAKE_DMX_TRANSPORT transport to report (default: the --transport asked for, or tcp)
"""

import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import refutil  # noqa: E402


def opt(argv, name, default=None):
    if name in argv:
        i = argv.index(name)
        if i + 1 >= len(argv):
            sys.exit(f"fake dmx: {name} needs a value")
        return argv[i + 1]
    return default


def hostport(addr):
    if not addr.startswith("tcp://"):
        sys.exit(f"fake dmx: bad address {addr!r}")
    host, port = addr[len("tcp://"):].rsplit(":", 1)
    return host, int(port)


def main(argv):
    if os.environ.get("FAKE_DMX_FAIL"):
        print("dmx bench: not built yet", file=sys.stderr)
        return 2
    if not argv or argv[0] != "bench":
        print("fake dmx: only 'bench' is faked", file=sys.stderr)
        return 2
    argv = argv[1:]
    listen, connect = opt(argv, "--listen"), opt(argv, "--connect")
    if listen:
        if os.environ.get("FAKE_DMX_LISTEN_FAIL"):
            print(f"dmx bench: listen({listen}) failed: Address already in use", file=sys.stderr)
            return 1
        stop = []
        signal.signal(signal.SIGINT, lambda *_: stop.append(1))
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(hostport(listen))
        s.listen(16)
        s.settimeout(0.1)
        print(f"fake dmx: listening on {listen}", file=sys.stderr, flush=True)
        while not stop:
            try:
                c, _ = s.accept()
                c.close()
            except socket.timeout:
                pass
        print("fake dmx: listener stopped", file=sys.stderr)
        return 0
    if connect:
        try:
            socket.create_connection(hostport(connect), timeout=5).close()
        except OSError as e:
            print(f"dmx bench: connect({connect}) failed: {e}", file=sys.stderr)
            return 1
    elif "--loopback" not in argv:
        print("fake dmx: need --loopback, --listen or --connect", file=sys.stderr)
        return 2
    mem = opt(argv, "--mem", "host")
    peer = opt(argv, "--peer-mem", mem)
    streams = int(opt(argv, "--streams", "1"))
    transport = os.environ.get("FAKE_DMX_TRANSPORT") or opt(argv, "--transport", "tcp")
    if transport == "auto":  # one host, as dmx: cuda_ipc between GPUs, else shm
        transport = "cuda_ipc" if mem.startswith("cuda") and peer.startswith("cuda") else "shm"
    rate = float(os.environ.get("FAKE_DMX_RATE", "1.0"))
    if mem.startswith("cuda"):
        rate = float(os.environ.get("FAKE_DMX_GPU_RATE", str(rate * 0.9)))
    for size in refutil.parse_sizes(opt(argv, "--sizes", "8,4K,1M,256M")):
        eff = rate * streams * size / (size + 64 * 1024)  # small messages are slower
        lat = 5.0 + size / (eff * 1e3)
        iters = int(opt(argv, "--iters", "10"))
        row = {"size_bytes": size, "gb_per_s": round(eff, 4), "msg_per_s": round(eff * 1e9 / size, 1),
               "p50_us": round(lat, 2), "p99_us": round(lat * 1.5, 2), "p999_us": round(lat * 2, 2),
               "transport": transport, "reason": "fake", "mem": mem,
               "peer_mem": peer, "streams": streams, "verified": "--verify" in argv,
               "op": opt(argv, "--op", "send"), "iters": iters, "lat_samples": iters,
               "cpu_pct": 50.0 * streams}
        if os.environ.get("FAKE_DMX_HALF_RTT"):
            row["half_rtt_us"] = float(os.environ["FAKE_DMX_HALF_RTT"])
        if "--json" in argv:
            print(json.dumps(row), flush=True)
        else:
            print(f"{size} B: {eff:.2f} GB/s", flush=True)
        time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
