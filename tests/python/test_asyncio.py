"""Futures are awaitable in asyncio."""
import asyncio

import numpy as np
import pytest

import dmx
from conftest import DATA, ECHO


def test_await_send_recv(peer):
    async def main():
        out = []
        for size in (0, 8, 100000):
            x = np.frombuffer(np.random.default_rng().bytes(size), np.uint8).copy()
            y = np.zeros(size, np.uint8)
            peer.command("echo", wait_reply=False, size=size)
            back = peer.ep.recv(y, ECHO)
            sent, got = await asyncio.gather(peer.ep.send(x, DATA), back)
            out.append((sent, got, np.array_equal(x, y)))
        return out

    assert asyncio.run(main()) == [(0, 0, True), (8, 8, True), (100000, 100000, True)]


def test_await_raises_and_cancel(peer):
    async def main():
        with pytest.raises(dmx.TimeoutError):
            await peer.ep.recv(bytearray(8), 90, timeout=0.1)
        fut = peer.ep.recv(bytearray(8), 91)
        task = asyncio.ensure_future(fut)  # a coroutine-like awaitable wrapped in a task
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(dmx.CancelledError):  # cancelling the task cancelled the operation
            fut.wait(timeout=10)

    asyncio.run(main())


def test_one_future_awaited_by_two_tasks(peer):
    async def main():
        x = np.frombuffer(np.random.default_rng().bytes(4096), np.uint8).copy()
        y = np.zeros(4096, np.uint8)
        back = peer.ep.recv(y, ECHO)
        first = asyncio.ensure_future(asyncio.wait_for(_awaited(back), 10))
        second = asyncio.ensure_future(asyncio.wait_for(_awaited(back), 10))
        await asyncio.sleep(0.05)  # both are waiting before the data comes
        peer.command("echo", wait_reply=False, size=4096)
        await peer.ep.send(x, DATA)
        return await asyncio.gather(first, second), np.array_equal(x, y)

    assert asyncio.run(main()) == ([4096, 4096], True)


async def _awaited(fut):
    return await fut
