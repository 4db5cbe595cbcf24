"""The other process of the Python tests: listens, accepts one endpoint, then obeys JSON commands
(tag CMD) from the test until told to exit. Prints its address as the first line of stdout.

Commands: echo (recv SIZE bytes, send them back), register (SIZE bytes of random data, optionally
on DEVICE; replies its descriptor and digest), digest (of the registered region), notify (waits
for a notification and replies it), exit.
"""
import hashlib
import json
import sys

import numpy as np

import dmx

CMD, REPLY, DATA, ECHO = 1, 2, 3, 4


def reply(ep, obj):
    ep.send(json.dumps(obj).encode(), REPLY).wait(timeout=30)


def region(size, device):
    rng = np.random.default_rng()
    host = np.frombuffer(rng.bytes(size), np.uint8).copy()
    if device == "cpu":
        return host, host
    import torch  # only the CUDA tests ask for a device
    return torch.from_numpy(host).to(device), host


def main():
    ctx = dmx.Context()
    lis = ctx.listen("tcp://127.0.0.1:0")
    print(lis.address, flush=True)
    ep = lis.accept(timeout=30)
    cmd_buf = bytearray(4096)
    mem = reg = None
    while True:
        n = ep.recv(cmd_buf, CMD).wait(timeout=120)
        cmd = json.loads(cmd_buf[:n])
        op = cmd["op"]
        if op == "echo":
            buf = np.empty(cmd["size"], np.uint8)
            got = ep.recv(buf, DATA).wait(timeout=60)
            ep.send(buf[:got], ECHO).wait(timeout=60)
        elif op == "register":
            if reg is not None:
                reg.deregister()
            mem, host = region(cmd["size"], cmd.get("device", "cpu"))
            reg = ctx.register(mem)
            reply(ep, {"descriptor": reg.descriptor().hex(), "digest": hashlib.sha256(host).hexdigest()})
        elif op == "digest":
            host = mem if isinstance(mem, np.ndarray) else mem.cpu().numpy()
            reply(ep, {"digest": hashlib.sha256(host).hexdigest()})
        elif op == "notify":
            note = ep.next_notification(timeout=30)
            reply(ep, {"value": note.value, "key": note.key, "length": note.length})
        elif op == "exit":
            reply(ep, {"ok": True})
            break
    ep.close()


if __name__ == "__main__":
    sys.exit(main())
