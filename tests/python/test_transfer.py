"""Two-sided transfers with a peer process: sizes from 0 to 256 MiB, sub-views, DLPack, lifetimes."""
import gc
import sys
import time
import weakref

import numpy as np
import pytest

import dmx
from conftest import DATA, ECHO

rng = np.random.default_rng()


def fresh(n):
    return np.frombuffer(rng.bytes(n), np.uint8).copy()


def echo(peer, src, dst, size=None):
    """Sends src to the peer, which sends it back into dst; returns the received size."""
    if size is None:
        size = len(memoryview(src).cast("B"))
    peer.command("echo", wait_reply=False, size=size)
    back = peer.ep.recv(dst, ECHO)
    assert peer.ep.send(src, DATA).wait(timeout=60) == size
    return back.wait(timeout=60)


@pytest.mark.parametrize("size", [0, 1, 7, 4095, (1 << 20) + 3, 256 << 20])
def test_echo_sizes(peer, size):
    x = fresh(size)
    y = np.zeros(size + 5, np.uint8)
    y[size:] = 0xA5  # beyond the message: untouched
    assert echo(peer, x, y) == size
    assert np.array_equal(y[:size], x)
    assert (y[size:] == 0xA5).all()


def test_sub_views(peer):
    base = fresh(10000)
    out = np.zeros(12000, np.uint8)
    # A NumPy slice, into the middle of a larger array.
    assert echo(peer, base[123:4567], out[1000:6000]) == 4567 - 123
    assert np.array_equal(out[1000:1000 + 4444], base[123:4567])
    assert not out[:1000].any() and not out[1000 + 4444:].any()
    # memoryview and bytearray sub-views; bytes as a source.
    ba = bytearray(3000)
    src = memoryview(base)[77:1077]
    assert echo(peer, src, memoryview(ba)[500:2500]) == 1000
    assert ba[500:1500] == base[77:1077].tobytes() and not any(ba[:500]) and not any(ba[1500:])
    ba2 = bytearray(64)
    assert echo(peer, bytes(base[:33]), ba2) == 33 and ba2[:33] == base[:33].tobytes()


def test_multidimensional_and_dtypes(peer):
    x = rng.standard_normal((37, 11)).astype(np.float32)
    y = np.zeros((37, 11), np.float32)
    assert echo(peer, x, y) == x.nbytes
    assert np.array_equal(x, y)


def test_rejects_unusable_buffers(peer):
    x = fresh(100)
    with pytest.raises(dmx.InvalidArgumentError, match="contiguous"):
        peer.ep.send(x[::2])
    with pytest.raises(dmx.InvalidArgumentError, match="writable"):
        peer.ep.recv(bytes(10))
    ro = fresh(10)
    ro.flags.writeable = False
    with pytest.raises(dmx.InvalidArgumentError):
        peer.ep.recv(ro)
    with pytest.raises(dmx.InvalidArgumentError, match="__dlpack__ or the buffer"):
        peer.ep.send("text")
    with pytest.raises(dmx.InvalidArgumentError):  # also a ValueError
        peer.ep.send(12)
    assert issubclass(dmx.InvalidArgumentError, ValueError)


class DLPackOnly:
    """Exposes an array through __dlpack__ only (as a tensor library does)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack(peer):
    x = fresh(5001)
    y = np.zeros(5001, np.uint8)
    before = sys.getrefcount(x), sys.getrefcount(y)
    assert echo(peer, DLPackOnly(x), DLPackOnly(y), 5001) == 5001
    assert np.array_equal(x, y)
    gc.collect()
    # The DLPack tensors were given back (their deleters ran): no reference left behind.
    assert (sys.getrefcount(x), sys.getrefcount(y)) == before
    # byte_offset / sub-views and shapes.
    z = np.zeros((4, 1000), np.uint8)
    assert echo(peer, DLPackOnly(x[1:2001].reshape(2, 1000)), DLPackOnly(z[1:3]), 2000) == 2000
    assert np.array_equal(z[1:3].ravel(), x[1:2001]) and not z[0].any() and not z[3].any()
    with pytest.raises(dmx.InvalidArgumentError, match="contiguous"):
        peer.ep.send(DLPackOnly(np.zeros((10, 10), np.uint8)[:, ::2]))


class Tracked(np.ndarray):
    """An ndarray that can be weakly referenced."""


def test_buffers_live_until_completion(peer):
    base = np.zeros(1000, np.uint8)
    dst = base.view(Tracked)  # a view of base that can be weakly referenced
    alive = weakref.ref(dst)
    peer.command("echo", wait_reply=False, size=1000)
    fut = peer.ep.recv(dst, ECHO)
    del dst
    gc.collect()
    assert alive() is not None  # the pending recv holds it
    x = fresh(1000)
    peer.ep.send(x, DATA).wait(timeout=30)
    assert fut.wait(timeout=30) == 1000
    assert np.array_equal(base, x)
    gc.collect()
    assert alive() is None  # completion let it go, though the future lives

    # A future dropped before completion: the endpoint keeps the buffer until the op completes.
    base = np.zeros(1000, np.uint8)
    dst = base.view(Tracked)
    alive = weakref.ref(dst)
    peer.command("echo", wait_reply=False, size=1000)
    peer.ep.recv(dst, ECHO)
    del dst
    gc.collect()
    assert alive() is not None
    peer.ep.send(x, DATA).wait(timeout=30)
    deadline = time.monotonic() + 30
    while alive() is not None:  # each new operation lets the completed orphans go
        assert time.monotonic() < deadline, "the orphaned recv never completed"
        peer.ep.recv(bytearray(1), 998).cancel()
        gc.collect()
        time.sleep(0.001)
    assert np.array_equal(base, x)


def test_any_tag_and_tag(peer):
    x = fresh(64)
    y = np.zeros(64, np.uint8)
    peer.command("echo", wait_reply=False, size=64)
    fut = peer.ep.recv(y, dmx.ANY_TAG)
    peer.ep.send(x, DATA).wait(timeout=30)
    assert fut.wait(timeout=30) == 64 and fut.tag == ECHO
    assert np.array_equal(x, y)
