#!/usr/bin/env python3
"""KV-cache transfer between a prefill and a decode process (disaggregated inference).

The decode process owns a paged KV cache (SLOTS blocks of BLOCK bytes), registers it with dmx and
tells the prefill process where each of its blocks goes (a block table). The prefill process
writes each block straight into its slot with a one-sided write and notify=block id; the decode
process learns from each notification that the block has landed, and checks its bytes.

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


def block_content(seed, block, size):
    """What prefill computes for `block`: fresh random bytes, reproducible from the run's seed."""
    return np.frombuffer(np.random.default_rng([seed, block]).bytes(size), np.uint8)


def on_device(a, device):
    if device == "cpu":
        return a.copy()
    import torch
    return torch.from_numpy(a.copy()).to(device)


def to_host(t):
    return t if isinstance(t, np.ndarray) else t.cpu().numpy()


def decode(a):
    ctx = dmx.Context()
    if a.device == "cpu":
        cache = np.zeros(a.slots * a.block, np.uint8)
    else:
        import torch
        cache = torch.zeros(a.slots * a.block, dtype=torch.uint8, device=a.device)
    reg = ctx.register(cache)
    lis = ctx.listen("tcp://127.0.0.1:0")
    print(lis.address, flush=True)
    ep = lis.accept(timeout=60)
    slots = np.random.default_rng().permutation(a.slots)[:a.blocks].tolist()  # the block table
    seed = secrets.randbits(63)
    table = {"descriptor": reg.descriptor().hex(), "block": a.block, "slots": slots, "seed": seed}
    ep.send(json.dumps(table).encode(), TABLE).wait(timeout=30)
    bad = 0
    for _ in range(a.blocks):
        note = ep.next_notification(timeout=60)  # this block has landed
        blk = note.value
        slot = slots[blk]
        got = to_host(cache[slot * a.block:(slot + 1) * a.block])
        if note.length != a.block or not np.array_equal(got, block_content(seed, blk, a.block)):
            bad += 1
    ep.send(json.dumps({"bad": bad}).encode(), DONE).wait(timeout=30)
    ep.close()
    reg.deregister()
    return 1 if bad else 0


def prefill(a, address):
    ctx = dmx.Context()
    ep = ctx.connect(address)
    buf = bytearray(1 << 20)
    n = ep.recv(buf, TABLE).wait(timeout=60)
    table = json.loads(buf[:n])
    d, block, slots, seed = bytes.fromhex(table["descriptor"]), table["block"], table["slots"], table["seed"]
    blocks = [on_device(block_content(seed, i, block), a.device) for i in range(len(slots))]
    if a.device != "cpu":
        import torch
        torch.cuda.synchronize()  # dmx copies on its own streams: the blocks must be complete
    # Posted first: a message that arrives after its recv is posted is never lost to the close that
    # follows it.
    done = ep.recv(buf, DONE)
    t0 = time.perf_counter()
    futs = [ep.write(blocks[i], d, offset=slots[i] * block, notify=i) for i in range(len(slots))]
    for f in futs:
        f.wait(timeout=60)
    secs = time.perf_counter() - t0
    n = done.wait(timeout=60)
    bad = json.loads(buf[:n])["bad"]
    total = len(slots) * block
    print(f"prefill -> decode: {len(slots)} blocks of {block} B from {a.device} in {secs * 1e3:.1f} ms "
          f"({total / secs / 1e9:.2f} GB/s) over {ep.stats()['transport']}; decode checked every block: "
          f"{'all bytes match' if bad == 0 else f'{bad} blocks DIFFER'}")
    ep.close()
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu (NumPy) or cuda:N (PyTorch)")
    ap.add_argument("--blocks", type=int, default=64, help="blocks the prefill writes")
    ap.add_argument("--slots", type=int, default=256, help="blocks in the decode's cache")
    ap.add_argument("--block", type=int, default=(256 << 10) + 3, help="bytes per block")
    ap.add_argument("--role", choices=["both", "decode"], default="both", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.blocks > a.slots:
        ap.error("--blocks must not exceed --slots")
    if a.role == "decode":
        return decode(a)
    child = subprocess.Popen([sys.executable, __file__, "--role", "decode", "--device", a.device, "--blocks",
                              str(a.blocks), "--slots", str(a.slots), "--block", str(a.block)],
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
