"""Only plain data moves: buffers whose items are Python objects or pointers are refused, on the
buffer-protocol road and on the DLPack road (issue 39)."""
import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dmx
from conftest import DATA, ECHO

rng = np.random.default_rng()
NEVER = 0x0B1EC7  # a tag the peer never sends on


def fresh(n):
    return np.frombuffer(rng.bytes(n), np.uint8).copy()


def echo(peer, src, dst, size):
    peer.command("echo", wait_reply=False, size=size)
    back = peer.ep.recv(dst, ECHO)
    assert peer.ep.send(src, DATA).wait(timeout=60) == size
    return back.wait(timeout=60)


def refused(peer, buf, match):
    """send, recv and register all refuse `buf`, naming why."""
    for post in (lambda: peer.ep.send(buf, NEVER), lambda: peer.ep.recv(buf, NEVER),
                 lambda: peer.ctx.register(buf)):
        with pytest.raises(dmx.InvalidArgumentError, match=match) as e:
            post()
        assert "not plain data" in str(e.value)


OBJECT_BUFFERS = {
    "numpy object array": (lambda: np.empty(4, dtype=object), "'O'"),
    "memoryview of one": (lambda: memoryview(np.array([1, "two", None], dtype=object)), "'O'"),
    "2-d object array": (lambda: np.empty((3, 2), dtype=object), "'O'"),
    "struct with an object field": (lambda: np.zeros(3, [("a", "<i4"), ("b", "O")]), r"'T\{.*O:b:"),
    "ctypes void pointers": (lambda: (ctypes.c_void_p * 4)(), "'<P'"),
    "ctypes char pointers": (lambda: (ctypes.c_char_p * 2)(), "'<z'"),
    "ctypes py_object": (lambda: (ctypes.py_object * 2)(), "'<O'"),
    "ctypes struct with a pointer": (
        lambda: (type("S", (ctypes.Structure,), {"_fields_": [("n", ctypes.c_int), ("p", ctypes.c_void_p)]}) * 2)(),
        r"'T\{"),
}


@pytest.mark.parametrize("name", sorted(OBJECT_BUFFERS))
def test_buffer_protocol_refuses_objects_and_pointers(peer, name):
    make, match = OBJECT_BUFFERS[name]
    refused(peer, make(), match)


def test_plain_formats_move(peer):
    # Numbers of every kind, bools, strings, padding, and structs and sub-arrays of these.
    arrays = [
        rng.standard_normal(1000).astype(np.float16),
        (rng.standard_normal(300) + 1j * rng.standard_normal(300)).astype(np.complex64),
        rng.integers(-2**62, 2**62, 500, dtype=np.int64),
        rng.integers(0, 2, 333).astype(bool),
        np.array([rng.bytes(4) for _ in range(50)], dtype="S4"),
        np.array(["".join(map(chr, rng.integers(0x41, 0x2000, 3))) for _ in range(40)], dtype="U3"),
    ]
    rec = np.zeros(100, np.dtype([("a", "u1"), ("b", "<i8"), ("m", "<f4", (2, 3))], align=True))
    rec["a"], rec["b"] = rng.integers(0, 256, 100), rng.integers(-2**40, 2**40, 100)
    rec["m"] = rng.standard_normal((100, 2, 3))
    arrays.append(rec)
    for x in arrays:
        assert memoryview(x).format not in ("O", "P")
        y = np.zeros_like(x)
        assert echo(peer, x, y, x.nbytes) == x.nbytes
        assert x.tobytes() == y.tobytes(), x.dtype


# The DLPack road. NumPy exports no object arrays through DLPack, and PyTorch is not everywhere:
# these producers hand over a DLPack 0.x capsule built here with ctypes, of any dtype.
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
OPAQUE_HANDLE, UINT = 3, 1


class Crafted:
    """A producer of one DLPack tensor over `mem` with the given dtype; it owns everything the
    capsule points to (no deleter), so it must outlive the operations that use it."""

    def __init__(self, mem, code, bits):
        self.mem = mem
        self.shape = (ctypes.c_int64 * 1)(mem.nbytes * 8 // bits)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data, t.device, t.ndim = mem.ctypes.data, DLDevice(1, 0), 1  # kDLCPU
        t.dtype = DLDataType(code, bits, 1)
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))

    def __dlpack__(self, **kwargs):
        if kwargs:  # max_version: a producer older than DLPack 1.0
            raise TypeError("__dlpack__() got an unexpected keyword argument")
        return _capsule_new(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (1, 0)


def test_dlpack_refuses_opaque_handles_and_unknown_dtypes(peer):
    pointers = np.array([id(o) for o in (peer, dmx, np)], dtype=np.uint64)  # what a peer must never get
    refused(peer, Crafted(pointers, OPAQUE_HANDLE, 64), "dtype code 3 .opaque handle.")
    refused(peer, Crafted(fresh(64), 99, 8), "dtype code 99 .unknown.")


def test_dlpack_plain_dtype_moves(peer):
    # The same producer with a plain dtype: the refusals above are about the dtype alone.
    x, y = fresh(4099), np.zeros(4099, np.uint8)
    src, dst = Crafted(x, UINT, 8), Crafted(y, UINT, 8)
    assert echo(peer, src, dst, 4099) == 4099
    assert np.array_equal(x, y)


CHILD = textwrap.dedent("""
    import numpy as np, dmx
    ctx = dmx.Context()
    lis = ctx.listen("tcp://127.0.0.1:0")
    a = ctx.connect(lis.address)
    b = lis.accept(timeout=30)
    objs = np.empty(8, dtype=object)
    objs[:] = [object() for _ in range(8)]
    try:
        fut = b.recv(objs)
    except dmx.InvalidArgumentError as e:
        print("refused:", e)
    else:  # the old behaviour: the peer's bytes land over the PyObject pointers
        a.send(np.frombuffer(np.random.default_rng().bytes(64), np.uint8)).wait(timeout=30)
        fut.wait(timeout=30)
        print("received", [repr(o) for o in objs])
""")


def test_recv_into_objects_leaves_the_interpreter_alive():
    # In its own process: without the check, the interpreter dies touching the array.
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, DMX_LOG_LEVEL="error"))
    assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
    assert "refused:" in r.stdout and "'O'" in r.stdout, r.stdout
