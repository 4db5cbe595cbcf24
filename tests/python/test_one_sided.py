"""One-sided write/read into the peer's registered memory, and notifications."""
import hashlib

import numpy as np
import pytest

import dmx

rng = np.random.default_rng()


def fresh(n):
    return np.frombuffer(rng.bytes(n), np.uint8).copy()


@pytest.mark.parametrize("size", [1, 4097, (8 << 20) + 1])
def test_write_then_read(peer, size):
    info = peer.command("register", size=size + 100)
    d = bytes.fromhex(info["descriptor"])
    assert len(d) == 16
    remote = dmx.RemoteRegion.from_descriptor(d)
    assert remote.size == size + 100
    # read everything first: the peer's random content
    before = np.zeros(size + 100, np.uint8)
    assert peer.ep.read(before, d).wait(timeout=60) == size + 100
    assert hashlib.sha256(before).hexdigest() == info["digest"]
    x = fresh(size)
    assert peer.ep.write(x, d, offset=50).wait(timeout=60) == size
    expect = before.copy()
    expect[50:50 + size] = x
    assert peer.command("digest")["digest"] == hashlib.sha256(expect).hexdigest()
    y = bytearray(size)
    assert peer.ep.read(y, remote, offset=50).wait(timeout=60) == size
    assert bytes(y) == x.tobytes()


def test_write_notify(peer):
    info = peer.command("register", size=1 << 16)
    d = bytes.fromhex(info["descriptor"])
    x = fresh(333)
    peer.ep.write(x, d, offset=1000, notify=0xDEADBEEF12345678).wait(timeout=30)
    note = peer.command("notify")
    assert note == {"value": 0xDEADBEEF12345678, "key": dmx.RemoteRegion.from_descriptor(d).key,
                    "length": 333}
    y = np.zeros(333, np.uint8)
    peer.ep.read(y, d, offset=1000).wait(timeout=30)
    assert np.array_equal(x, y)


def test_out_of_range_and_bad_descriptor(peer):
    info = peer.command("register", size=4096)
    d = bytes.fromhex(info["descriptor"])
    with pytest.raises(dmx.OutOfRangeError) as e:
        peer.ep.write(fresh(100), d, offset=4000).wait(timeout=30)
    assert e.value.peer and "4096" in e.value.message
    with pytest.raises(dmx.InvalidArgumentError):
        dmx.RemoteRegion.from_descriptor(b"short")
    with pytest.raises(dmx.InvalidArgumentError):
        peer.ep.read(bytearray(4), "not a descriptor")
    # A strided view of the descriptor's bytes is refused, not read past its end.
    with pytest.raises(dmx.InvalidArgumentError, match="contiguous"):
        peer.ep.read(bytearray(4), memoryview(d + d)[::2])
    with pytest.raises(dmx.InvalidArgumentError, match="contiguous"):
        peer.ep.read(bytearray(4), np.frombuffer(d + d, np.uint8)[::2])


def test_local_registration(peer):
    z = np.zeros(4096, np.uint8)
    with peer.ctx.register(z) as reg:
        assert len(reg.descriptor()) == 16 and reg.remote.size == 4096
    with pytest.raises(dmx.InvalidArgumentError):
        peer.ctx.register(b"read-only bytes")
