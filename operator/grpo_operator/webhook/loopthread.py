"""An asyncio event loop on a thread of its own, for work that must not wait behind the operator's loop (the webhook's
serving, the Lease elector), and the way to run a coroutine on it from another loop.

Python runs one thread at a time, but a thread that wants the GIL gets it within the interpreter's switch interval
(5 ms): work on another loop is delayed by that much at most, never by a whole burst of callbacks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on this thread's loop and wait for it from the calling loop; cancelling the wait cancels it."""
        return await run_on(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


async def run_on(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """Run `coro` on `loop` (another thread's) and wait for it from the calling loop."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
