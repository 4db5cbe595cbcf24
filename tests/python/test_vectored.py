"""Vectored operations from Python: lists read from arrays in C++, checked whole, one completion."""
import array
import hashlib

import numpy as np
import pytest

import dmx
from conftest import DATA, ECHO

rng = np.random.default_rng()


def fresh(n):
    return np.frombuffer(rng.bytes(n), np.uint8).copy()


def remote_copy(peer, size):
    """The peer registers `size` random bytes: (descriptor, our copy of its bytes)."""
    info = peer.command("register", size=size)
    d = bytes.fromhex(info["descriptor"])
    mirror = np.zeros(size, np.uint8)
    peer.ep.read(mirror, d).wait(timeout=60)
    assert hashlib.sha256(mirror).hexdigest() == info["digest"]
    return d, mirror


def peer_holds(peer, expect):
    return peer.command("digest")["digest"] == hashlib.sha256(expect).hexdigest()


def scattered(n, block, slots):
    """n distinct slots of `block` bytes among `slots`, shuffled, as byte offsets."""
    return rng.permutation(slots)[:n].astype(np.int64) * block


@pytest.mark.parametrize("n", [0, 1, 100_000])
def test_write_and_read_blocks(peer, n):
    block = 3  # odd sizes and offsets
    slots = max(n, 1) + 7
    d, mirror = remote_copy(peer, slots * block + 1)
    src = fresh(slots * block + 5)
    lo = scattered(n, block, slots) + 1  # odd local offsets too
    ro = scattered(n, block, slots) + 1
    fut = peer.ep.write_blocks(src, d, lo, ro, block, notify=11)
    assert fut.wait(timeout=120) == n * block
    within = np.arange(block)
    expect = mirror.copy()
    expect[ro[:, None] + within] = src[lo[:, None] + within]
    note = peer.command("notify")
    assert note["value"] == 11 and note["length"] == n * block
    assert peer_holds(peer, expect)
    back = np.zeros_like(src)
    assert peer.ep.read_blocks(back, d, lo, ro, np.full(n, block, np.uint16)).wait(timeout=120) == n * block
    moved = np.zeros(len(src), bool)
    moved[lo[:, None] + within] = True
    assert np.array_equal(back[moved], src[moved]) and not back[~moved].any()


def test_blocks_of_several_buffers(peer):
    # The layers of a KV cache: several local buffers, one remote region, each layer's blocks at
    # its own remote offsets (an IO_ENTRY array); the blocks form with the same offsets for every
    # layer would overlap in the one region, and is refused.
    layers, n, block = 3, 40, 101
    d, mirror = remote_copy(peer, layers * n * block)
    bufs = [fresh(n * block) for _ in range(layers)]
    lo = np.arange(n, dtype=np.uint32) * block
    ro = rng.permutation(n).astype(np.uint64) * block
    with pytest.raises(dmx.Error, match="entry"):  # the same remote ranges for every layer overlap
        peer.ep.write_blocks(bufs, d, lo, ro, block).wait(timeout=60)
    entries = np.zeros(layers * n, dmx.IO_ENTRY)
    for i in range(layers):
        e = entries[i * n:(i + 1) * n]
        e["local"] = i
        e["local_offset"] = lo
        e["remote_offset"] = ro + i * n * block
        e["length"] = block
    assert peer.ep.write_vec(bufs, d, entries).wait(timeout=60) == layers * n * block
    expect = mirror.copy()
    for i in range(layers):
        for j in range(n):
            at = int(ro[j]) + i * n * block
            expect[at:at + block] = bufs[i][j * block:(j + 1) * block]
    assert peer_holds(peer, expect)


def test_entries_as_integers(peer):
    d, mirror = remote_copy(peer, 4096)
    a, b = fresh(100), fresh(200)
    # (local index, remote index, local offset, remote offset, length); a strided view of a larger array
    table = np.array([[0, 0, 5, 1000, 90], [1, 0, 0, 7, 200], [0, 0, 0, 3000, 1]], np.int32)
    wide = np.zeros((3, 10), np.int32)
    wide[:, ::2] = table
    assert peer.ep.write_vec([a, b], [d], wide[:, ::2]).wait(timeout=60) == 291
    expect = mirror.copy()
    expect[1000:1090] = a[5:95]
    expect[7:207] = b
    expect[3000] = a[0]
    assert peer_holds(peer, expect)
    back = np.zeros(291, np.uint8)
    got = peer.ep.read_vec(back, d, np.array([[0, 0, 0, 1000, 90], [0, 0, 90, 7, 200], [0, 0, 290, 3000, 1]]))
    assert got.wait(timeout=60) == 291
    assert np.array_equal(back, np.concatenate([a[5:95], b, a[:1]]))


def test_send_and_recv_blocks(peer):
    src = fresh(1000)
    offsets = array.array("q", [999, 0, 500, 17])
    lengths = array.array("I", [1, 17, 333, 5])
    total = sum(lengths)
    peer.command("echo", wait_reply=False, size=total)
    dst = np.zeros(1000, np.uint8)
    back = peer.ep.recv_blocks(dst, offsets, lengths, ECHO)
    assert peer.ep.send_blocks(src, offsets, lengths, DATA).wait(timeout=60) == total
    assert back.wait(timeout=60) == total
    for o, n in zip(offsets, lengths):
        assert np.array_equal(dst[o:o + n], src[o:o + n])
    # The pieces form, an IO_PIECE array over two buffers.
    x, y = fresh(64), fresh(64)
    pieces = np.zeros(2, dmx.IO_PIECE)
    pieces["region"], pieces["offset"], pieces["length"] = [1, 0], [3, 60], [10, 4]
    peer.command("echo", wait_reply=False, size=14)
    out = bytearray(14)
    back = peer.ep.recv(out, ECHO)
    assert peer.ep.send_vec([x, y], pieces, DATA).wait(timeout=60) == 14
    assert back.wait(timeout=60) == 14
    assert bytes(out) == y[3:13].tobytes() + x[60:64].tobytes()


def test_out_of_bounds_refused_with_the_entry_index(peer):
    d, mirror = remote_copy(peer, 1000)
    src = fresh(1000)
    ro = np.arange(10, dtype=np.int64) * 10
    ro[7] = 995  # 995 + 10 > 1000
    fut = peer.ep.write_blocks(src, d, np.arange(10) * 10, ro, 10)
    with pytest.raises((dmx.OutOfRangeError, dmx.InvalidArgumentError), match="entry 7"):
        fut.wait(timeout=30)
    assert fut.failed_entry == 7
    assert peer_holds(peer, mirror)  # refused whole: not a byte moved
    lo = np.arange(10, dtype=np.int64) * 10
    lo[3] = 999  # past the local buffer
    fut = peer.ep.write_blocks(src, d, lo, np.arange(10) * 10, 10)
    with pytest.raises(dmx.Error, match="entry 3"):
        fut.wait(timeout=30)
    assert fut.failed_entry == 3
    assert peer_holds(peer, mirror)
    ok = peer.ep.write_blocks(src, d, [0], [0], 1)  # the endpoint goes on
    assert ok.wait(timeout=30) == 1 and ok.failed_entry == -1


@pytest.mark.parametrize("bad, message", [
    (dict(local_offsets=np.zeros(3, np.float64)), "local_offsets: expected integers, got items of format 'd'"),
    (dict(remote_offsets=np.zeros((3, 1), np.int64)), r"remote_offsets: expected one dimension, got shape \(3, 1\)"),
    (dict(lengths=np.zeros((3, 2), np.int64)), r"lengths: expected one dimension \(or a single int\)"),
    (dict(local_offsets=np.array([0, 5, -4])), r"local_offsets\[2\] = -4: offsets, lengths and indices must not"),
    (dict(remote_offsets=np.zeros(4, np.int64)), "one value per block"),
    (dict(lengths=np.zeros(2, np.int64)), "one value per block"),
    (dict(lengths=-1), "lengths: -1 is not a length"),
    (dict(local_offsets=np.zeros(3, ">i8")), "big-endian"),
    (dict(local_offsets=np.zeros(3, bool)), "expected integers"),
    (dict(local_offsets="012"), "expected an array of integers"),
    (dict(local_offsets=[0, 1.5, 2]), r"local_offsets\[1\]: expected an int, got float"),
    (dict(remote_offsets=(0, 10, -20)), r"remote_offsets\[2\] = -20"),
])
def test_wrong_offset_arrays_refused(peer, bad, message):
    d = bytes.fromhex(peer.command("register", size=100)["descriptor"])
    args = dict(local_offsets=np.zeros(3, np.int64), remote_offsets=np.arange(3) * 10, lengths=5)
    args.update(bad)
    with pytest.raises(dmx.InvalidArgumentError, match=message):
        peer.ep.write_blocks(fresh(100), d, **args)


def test_wrong_entries_refused(peer):
    d = bytes.fromhex(peer.command("register", size=100)["descriptor"])
    with pytest.raises(dmx.InvalidArgumentError, match=r"entries: expected shape \(n, 5\), got shape \(2, 4\)"):
        peer.ep.write_vec(fresh(10), d, np.zeros((2, 4), np.int64))
    with pytest.raises(dmx.InvalidArgumentError, match="dtype dmx.IO_ENTRY"):
        peer.ep.write_vec(fresh(10), d, np.zeros(2, [("a", "u8"), ("b", "u8")]))
    with pytest.raises(dmx.InvalidArgumentError, match=r"entries\[1, 0\] = 4294967296"):
        peer.ep.write_vec(fresh(10), d, np.array([[0, 0, 0, 0, 1], [1 << 32, 0, 0, 0, 1]], np.uint64))
    with pytest.raises(dmx.InvalidArgumentError, match=r"pieces: expected shape \(n, 3\)"):
        peer.ep.send_vec(fresh(10), np.zeros(3, np.int64))
    with pytest.raises(dmx.InvalidArgumentError, match="regions for 2 buffers"):
        peer.ep.write_blocks([fresh(10), fresh(10)], [d, d, d], [0], [0], 1)


def as_entries(raw):
    return np.frombuffer(raw, dmx.IO_ENTRY)


def test_blocks_list_built_in_cpp():
    from dmx import _dmx
    lo = np.arange(0, 50, 5, dtype=np.int16)[::-1]  # any integer width, strided, reversed
    ro = array.array("Q", range(100, 110))
    e = as_entries(_dmx._blocks_entries(3, 3, lo, ro, np.uint8(7)))  # a 0-D length for every block
    assert len(e) == 30
    for i in range(3):
        part = e[i * 10:(i + 1) * 10]
        assert (part["local"] == i).all() and (part["remote"] == i).all()
        assert part["local_offset"].tolist() == lo.tolist() and part["remote_offset"].tolist() == list(ro)
        assert (part["length"] == 7).all()
    e = as_entries(_dmx._blocks_entries(2, 1, [0, 1], np.array([5, 6]), np.array([1, 2], np.int8)))
    assert e["remote"].tolist() == [0, 0, 0, 0] and e["length"].tolist() == [1, 2, 1, 2]
    assert len(_dmx._blocks_entries(4, 1, np.zeros(0, np.int64), np.zeros(0, np.int64), 1)) == 0


def test_io_entry_and_integer_arrays():
    from dmx import _dmx
    e = np.zeros(1000, dmx.IO_ENTRY)
    e["local"] = rng.integers(0, 5, 1000)
    e["local_offset"] = rng.integers(0, 1 << 40, 1000)
    e["length"] = 3
    assert _dmx._entries(e) == e.tobytes()
    assert _dmx._entries(e[::3]) == e[::3].tobytes()  # strided
    table = np.stack([e[f] for f in e.dtype.names], axis=1).astype(np.int64)  # shape (n, 5)
    assert _dmx._entries(table) == e.tobytes()
    assert _dmx._entries(table.T.copy().T) == e.tobytes()  # column-major


def test_entries_limit_refused():
    from dmx import _dmx
    with pytest.raises(dmx.InvalidArgumentError, match="too many entries"):
        _dmx._blocks_entries(1 << 20, 1, np.zeros(32, np.int64), np.zeros(32, np.int64), 1)


def test_refused_arrays_are_let_go():
    from dmx import _dmx
    ba = bytearray(10)  # items of format 'B': integers, one dimension
    with pytest.raises(dmx.InvalidArgumentError, match=r"expected shape \(n, 5\)"):
        _dmx._entries(ba)
    ba.extend(b"x")  # BufferError if the refused call still held a view of it
    with pytest.raises(dmx.InvalidArgumentError, match="one value per block"):
        _dmx._blocks_entries(1, 1, ba, bytearray(3), 1)
    ba.extend(b"y")
