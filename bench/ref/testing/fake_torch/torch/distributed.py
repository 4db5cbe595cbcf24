"""Fake torch.distributed: no data moves; recv() writes the sender's pattern. It writes the
NCCL log lines bench/ref/nccl_socket.py parses, choosing the transport from the environment
as NCCL would."""
import os

import torch


def is_available():
    return True


def is_nccl_available():
    return True


def init_process_group(backend=None, rank=0, world_size=1, init_method=None, timeout=None,
                       device_id=None):
    if os.environ.get("FAKE_TORCH_INIT_FAIL"):
        raise RuntimeError("fake: NCCL error: unhandled system error")
    if os.environ.get("FAKE_TORCH_HANG"):
        import time
        time.sleep(3600)
    path = os.environ.get("NCCL_DEBUG_FILE", "").replace("%h", "fake").replace("%p", str(os.getpid()))
    if not path:
        return
    via = "NET/Socket/0" if os.environ.get("NCCL_P2P_DISABLE") == "1" else "P2P/CUMEM/read"
    with open(path, "w") as fh:
        for k in sorted(os.environ):
            if k.startswith("NCCL_") and not k.startswith("NCCL_DEBUG"):
                fh.write(f"fake:1:1 [0] NCCL INFO {k} set by environment to {os.environ[k]}\n")
        fh.write(f"fake:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via {via}\n")
        if os.environ.get("FAKE_NCCL_VIA"):
            fh.write(f"fake:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via {os.environ['FAKE_NCCL_VIA']}\n")


def send(t, dst=None):
    pass


_patterns = {}


def recv(t, src=None):
    n = len(t.data)
    if n not in _patterns:
        _patterns[n] = torch.arange(251).repeat(-(-n // 251)).data[:n]
    t.data[:] = _patterns[n]


def all_reduce(t):
    pass


def destroy_process_group():
    pass
