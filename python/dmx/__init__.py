"""dmx — device memory exchange: move tensors between processes and hosts.

    import dmx, numpy as np
    ctx = dmx.Context()                      # settings as keywords: dmx.Context(streams=4)
    lis = ctx.listen("tcp://127.0.0.1:0")    # lis.address: the real port
    ep = lis.accept(timeout=20)              # the other side: ep = ctx.connect(address)
    ep.send(x).wait(); n = ep.recv(y).wait()
    reg = ctx.register(z); d = reg.descriptor()
    ep.write(x, d, offset=0).wait(); ep.read(y, d, offset=0).wait()
    ep.write_blocks(cache, d, src_offsets, dst_offsets, block_bytes, notify=7)   # one operation

Buffers are anything with __dlpack__ (PyTorch, CuPy, JAX, NumPy; CPU, pinned or CUDA memory) or
the buffer protocol (NumPy, bytearray, memoryview), contiguous. Operations return futures:
wait(timeout=None), done(), cancel(), and `await`. Failures raise dmx.Error subclasses.
See docs/python.md.
"""
from . import _dmx, _log  # noqa: F401 (_log routes dmx's log lines to logging)
from ._aio import _await
from ._errors import (AuthError, CancelledError, ClosedError, DataLossError, Error, InternalError,
                      InvalidArgumentError, IoError, NotFoundError, OutOfRangeError,
                      PeerFailedError, ProtocolError, ResourceExhaustedError, TimeoutError,
                      TruncatedError, UnavailableError)
from ._dmx import (ANY_TAG, Context, Endpoint, Future, Listener, Notification, Registration,
                   RemoteRegion, build_info)

Future.__await__ = _await
__version__ = build_info()["version"]


def __getattr__(name):
    # IO_ENTRY and IO_PIECE are NumPy dtypes, made on first use: importing dmx needs no NumPy.
    if name in ("IO_ENTRY", "IO_PIECE"):
        import numpy as np
        globals()["IO_ENTRY"] = np.dtype([("local", "=u4"), ("remote", "=u4"), ("local_offset", "=u8"),
                                          ("remote_offset", "=u8"), ("length", "=u8")])
        globals()["IO_PIECE"] = np.dtype([("region", "=u4"), ("reserved", "=u4"), ("offset", "=u8"),
                                          ("length", "=u8")])
        return globals()[name]
    raise AttributeError(f"module 'dmx' has no attribute {name!r}")

__all__ = [
    "ANY_TAG", "IO_ENTRY", "IO_PIECE", "Context", "Endpoint", "Future", "Listener", "Notification", "Registration",
    "RemoteRegion", "build_info", "Error", "AuthError", "CancelledError", "ClosedError", "DataLossError",
    "InternalError", "InvalidArgumentError", "IoError", "NotFoundError", "OutOfRangeError",
    "PeerFailedError", "ProtocolError", "ResourceExhaustedError", "TimeoutError",
    "TruncatedError", "UnavailableError",
]
