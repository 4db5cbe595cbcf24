"""checksum="crc32c": every operation reports the CRC32C of the bytes it moved, on both sides."""
import os

import dmx

_TABLE = []
for _b in range(256):
    _c = _b
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 if _c & 1 else 0)
    _TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def test_known_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_both_sides_report_the_crc_of_the_bytes():
    server = dmx.Context()
    client = dmx.Context(checksum="crc32c")  # one side asking turns it on for both
    lis = server.listen("tcp://127.0.0.1:0")
    ep = client.connect(lis.address)
    peer = lis.accept(timeout=10)
    for size in (0, 1, 100, 100_003):
        data = os.urandom(size)
        into = bytearray(size)
        r = peer.recv(into, 5)
        s = ep.send(data, 5)
        assert s.wait(timeout=30) == size
        assert r.wait(timeout=30) == size
        assert bytes(into) == data
        assert s.crc32c == r.crc32c == crc32c(data)
    ep.close()
    peer.close()


def test_without_checksums_it_is_zero():
    ctx = dmx.Context()
    lis = ctx.listen("tcp://127.0.0.1:0")
    ep = ctx.connect(lis.address)
    peer = lis.accept(timeout=10)
    r = peer.recv(bytearray(10), 1)
    s = ep.send(b"0123456789", 1)
    s.wait(timeout=30)
    r.wait(timeout=30)
    assert s.crc32c == 0 and r.crc32c == 0
    ep.close()
    peer.close()
