#!/usr/bin/env python3
"""KV-cache transfer between a prefill and a decode process (disaggregated inference).

Both processes keep a paged KV cache: LAYERS tensors of SLOTS blocks of BLOCK bytes each. The
decode process registers its tensors with dmx and gives the prefill process, for each request,
the slots its blocks go to (a block table). The prefill process moves a request with one vectored
write: every layer's blocks, from its own scattered slots to the decode's, are one operation
(`write_blocks`: a list of LAYERS x BLOCKS entries built in C++ from two arrays of offsets), with
one notification (notify=request id) once the last byte has landed. The decode process learns
from that one notification that the whole request is there, and checks its bytes.

    PYTHONPATH=build/python python3 examples/python/kv_cache.py                    # NumPy, host
    PYTHONPATH=build/python python3 examples/python/kv_cache.py --device cuda:0    # torch, GPU

Runs both roles (decode in a child process); exits non-zero if any byte differs.
"""
import argparse
import json
import secrets
import subprocess
import sys
import time

import numpy as np

import dmx

TABLE, DONE = 1, 2


def block_content(seed, request, layer, block, size):
    """What prefill computed for one block: fresh random bytes, reproducible from the run's seed."""
    return np.frombuffer(np.random.default_rng([seed, request, layer, block]).bytes(size), np.uint8)


def cache(a):
    """One layer's paged cache: SLOTS blocks of BLOCK bytes, zeros."""
    if a.device == "cpu":
        return np.zeros(a.slots * a.block, np.uint8)
    import torch
    return torch.zeros(a.slots * a.block, dtype=torch.uint8, device=a.device)


def to_host(t):
    return t if isinstance(t, np.ndarray) else t.cpu().numpy()


def decode(a):
    ctx = dmx.Context()
    layers = [cache(a) for _ in range(a.layers)]
    regs = [ctx.register(t) for t in layers]
    lis = ctx.listen("tcp://127.0.0.1:0")
    print(lis.address, flush=True)
    ep = lis.accept(timeout=60)
    # The block table: distinct slots of this cache for every block of every request.
    slots = np.random.default_rng().permutation(a.slots)[:a.requests * a.blocks].reshape(a.requests, a.blocks)
    seed = secrets.randbits(63)
    table = {"descriptors": [r.descriptor().hex() for r in regs], "block": a.block, "slots": slots.tolist(),
             "seed": seed}
    ep.send(json.dumps(table).encode(), TABLE).wait(timeout=30)
    bad = 0
    for _ in range(a.requests):
        note = ep.next_notification(timeout=60)  # every block of this request, in every layer, has landed
        req = note.value
        if note.length != a.layers * a.blocks * a.block:
            bad += 1
        for layer, t in enumerate(layers):
            host = to_host(t)
            for j, slot in enumerate(slots[req].tolist()):
                got = host[slot * a.block:(slot + 1) * a.block]
                if not np.array_equal(got, block_content(seed, req, layer, j, a.block)):
                    bad += 1
    ep.send(json.dumps({"bad": bad}).encode(), DONE).wait(timeout=30)
    ep.close()
    for r in regs:
        r.deregister()
    return 1 if bad else 0


def prefill(a, address):
    ctx = dmx.Context()
    ep = ctx.connect(address)
    buf = bytearray(1 << 22)
    n = ep.recv(buf, TABLE).wait(timeout=60)
    table = json.loads(buf[:n])
    descs = [bytes.fromhex(d) for d in table["descriptors"]]
    block, seed = table["block"], table["seed"]
    dst_slots = np.array(table["slots"], np.int64)
    requests, blocks = dst_slots.shape
    # Our own paged cache: each request's blocks at scattered slots, every layer alike.
    src_slots = np.random.default_rng().permutation(a.slots)[:requests * blocks].reshape(requests, blocks)
    host = [np.zeros(a.slots * block, np.uint8) for _ in range(a.layers)]
    for r in range(requests):
        for layer in range(a.layers):
            for j, slot in enumerate(src_slots[r].tolist()):
                host[layer][slot * block:(slot + 1) * block] = block_content(seed, r, layer, j, block)
    if a.device == "cpu":
        layers = host
    else:
        import torch
        layers = [torch.from_numpy(h).to(a.device) for h in host]
        torch.cuda.synchronize()  # dmx copies on its own streams: the blocks must be complete
    # Posted first: a message that arrives after its recv is posted is never lost to the close that
    # follows it.
    done = ep.recv(buf, DONE)
    t0 = time.perf_counter()
    # One operation per request: layer i's blocks go to the decode's layer i (descs[i]).
    futs = [ep.write_blocks(layers, descs, src_slots[r] * block, dst_slots[r] * block, block, notify=r)
            for r in range(requests)]
    posted = time.perf_counter() - t0
    for f in futs:
        f.wait(timeout=60)
    secs = time.perf_counter() - t0
    n = done.wait(timeout=60)
    bad = json.loads(buf[:n])["bad"]
    total = requests * a.layers * blocks * block
    print(f"prefill -> decode: {requests} requests of {a.layers} layers x {blocks} blocks of {block} B from "
          f"{a.device}, one write_blocks each (posted in {posted * 1e3:.2f} ms), in {secs * 1e3:.1f} ms "
          f"({total / secs / 1e9:.2f} GB/s) over {ep.stats()['transport']}; decode checked every block: "
          f"{'all bytes match' if bad == 0 else f'{bad} blocks DIFFER'}")
    ep.close()
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu (NumPy) or cuda:N (PyTorch)")
    ap.add_argument("--requests", type=int, default=4, help="requests the prefill hands over")
    ap.add_argument("--blocks", type=int, default=64, help="blocks per request")
    ap.add_argument("--layers", type=int, default=2, help="cache tensors per side (layers' K and V)")
    ap.add_argument("--slots", type=int, default=256, help="blocks in each cache tensor")
    ap.add_argument("--block", type=int, default=(256 << 10) + 3, help="bytes per block")
    ap.add_argument("--role", choices=["both", "decode"], default="both", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.requests * a.blocks > a.slots:
        ap.error("--requests x --blocks must not exceed --slots")
    if a.role == "decode":
        return decode(a)
    child = subprocess.Popen([sys.executable, __file__, "--role", "decode", "--device", a.device, "--requests",
                              str(a.requests), "--blocks", str(a.blocks), "--layers", str(a.layers), "--slots",
                              str(a.slots), "--block", str(a.block)],
                             stdout=subprocess.PIPE, text=True)
    try:
        address = child.stdout.readline().strip()
        if not address:
            return child.wait() or 1
        rc = prefill(a, address)
        return rc or child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


if __name__ == "__main__":
    sys.exit(main())
