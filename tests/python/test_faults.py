"""Cancel, timeouts, peer death, errors, and the GIL while waiting."""
import threading
import time

import numpy as np
import pytest

import dmx


def test_cancel(peer):
    fut = peer.ep.recv(bytearray(16), 77)
    assert not fut.done()
    fut.cancel()
    with pytest.raises(dmx.CancelledError) as e:
        fut.wait(timeout=10)
    assert fut.done() and "cancel" in str(e.value)


def test_wait_timeout_leaves_the_operation_running(peer):
    fut = peer.ep.recv(bytearray(16), 78)
    t = time.monotonic()
    with pytest.raises(dmx.TimeoutError):
        fut.wait(timeout=0.2)
    assert 0.15 < time.monotonic() - t < 5
    assert not fut.done()
    fut.cancel()
    with pytest.raises(dmx.CancelledError):
        fut.wait(timeout=10)


def test_operation_timeout(peer):
    fut = peer.ep.recv(bytearray(16), 79, timeout=0.2)
    with pytest.raises(dmx.TimeoutError) as e:
        fut.wait(timeout=10)
    assert isinstance(e.value, TimeoutError) and e.value.code == "timeout"
    with pytest.raises(dmx.TimeoutError):
        peer.ep.next_notification(timeout=0.1)


def test_gil_released_while_waiting(peer):
    count = 0
    stop = threading.Event()

    def spin():
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        fut = peer.ep.recv(bytearray(16), 80)
        with pytest.raises(dmx.TimeoutError):
            fut.wait(timeout=0.3)
        before = count
        with pytest.raises(dmx.TimeoutError):
            fut.wait(timeout=0.3)
        assert count - before > 1000  # the other thread ran while we waited
        fut.cancel()
    finally:
        stop.set()
        t.join()


def test_peer_death(own_peer):
    ep = own_peer.ep
    pending = ep.recv(np.zeros(1 << 20, np.uint8), 81)
    own_peer.proc.kill()
    own_peer.proc.wait()
    t = time.monotonic()
    with pytest.raises(dmx.Error) as e:
        pending.wait(timeout=30)
    assert not isinstance(e.value, dmx.TimeoutError), e.value  # failed, not merely slow
    assert time.monotonic() - t < 20
    with pytest.raises(dmx.Error):
        ep.send(np.ones(100, np.uint8)).wait(timeout=30)


def test_errors_carry_code_and_peer():
    with pytest.raises(dmx.InvalidArgumentError):
        dmx.Context(streams="many")
    ctx = dmx.Context(connect_timeout="2s")
    lis = ctx.listen("tcp://127.0.0.1:0")
    address = lis.address
    lis.close()
    with pytest.raises(dmx.Error) as e:
        ctx.connect(address)
    assert e.value.message and str(e.value).startswith(e.value.code)


def test_accept_timeout():
    ctx = dmx.Context()
    lis = ctx.listen("tcp://127.0.0.1:0")
    assert lis.address.startswith("tcp://127.0.0.1:") and not lis.address.endswith(":0")
    t = time.monotonic()
    with pytest.raises(dmx.TimeoutError):
        lis.accept(timeout=0.2)
    assert time.monotonic() - t < 5
