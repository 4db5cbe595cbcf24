"""asyncio support: `await ep.send(x)`.

A completion on a dmx thread posts the operation's id to its event loop's waker (an eventfd) and
touches nothing of Python; the loop reads the eventfd (add_reader) and resolves the asyncio future
on its own thread. So no dmx thread ever takes the GIL for asyncio.
"""
import asyncio
import itertools
import weakref

from . import _dmx


class _LoopWaker:
    def __init__(self, loop):
        self.core = _dmx._Waker()
        self.pending = {}  # id -> asyncio.Future
        self.ids = itertools.count()
        loop.add_reader(self.core.fileno(), self._drain)

    def _drain(self):
        for i in self.core.drain():
            f = self.pending.pop(i, None)
            if f is not None and not f.done():
                f.set_result(None)


_wakers = weakref.WeakKeyDictionary()  # event loop -> _LoopWaker


def _await(fut):
    """Future.__await__: suspends until the operation completes; returns wait()'s value.
    Cancelling the awaiting task cancels the operation."""
    if not fut.done():
        loop = asyncio.get_running_loop()
        w = _wakers.get(loop)
        if w is None:
            w = _wakers[loop] = _LoopWaker(loop)
        wid = next(w.ids)
        af = loop.create_future()
        w.pending[wid] = af
        try:
            if fut._watch(w.core, wid):
                yield from af
        except asyncio.CancelledError:
            fut.cancel()
            raise
        finally:
            w.pending.pop(wid, None)
    # Complete, or about to be: the callback fires just before the request reads as done.
    return fut.wait()
