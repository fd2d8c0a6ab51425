"""The caller's end of a request for asyncio code: `async for` over text pieces, then the result.

A request's events are put on the generator's worker thread; `LoopOutbox.put` hands each one to the event loop with
`call_soon_threadsafe`, so nothing blocks the loop and no thread waits per request. The request itself is submitted
in a thread on first use (a first grammar builds its view of the vocabulary, ~1.6 s on a 150k vocabulary).
"""

from __future__ import annotations

import asyncio
import time

from specedge.runtime.sequences import GenerationResult


class LoopOutbox:
    """A sequence's outbox whose events land in an asyncio.Queue on `loop`, each as (time.perf_counter() when the
    worker put it, event): a server decides by when an event was made, not read, whether it beat a deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.queue = loop, asyncio.Queue()

    def put(self, event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (time.perf_counter(), event))
        except RuntimeError:            # the loop is closed: nobody is listening any more
            pass


class AsyncStream:
    """`async for piece in stream` for text pieces as tokens are committed; `result` holds the GenerationResult
    once it ends; `await stream.wait()` drains it. Errors in the options, a full queue or a prompt too long raise
    where the stream is first awaited. `cancel()` (never blocking, from any thread), leaving an `async with` block,
    breaking out of the loop and closing the stream with `await stream.aclose()`, or cancelling the task that
    awaits it, ends the request at the next step boundary (stop_reason "cancelled")."""

    def __init__(self, submit):
        self._submit = submit           # (outbox) -> the runtime's Stream, submitted with that outbox
        self._stream = None             # that Stream, once submitted (it cancels)
        self._outbox: LoopOutbox | None = None
        self._cancelled = False
        self.result: GenerationResult | None = None
        self.tokens: list[int] = []     # ids received so far
        self.logprobs: list = []        # their TokenLogprobs, when the request asked for them
        self.text = ""

    async def _started(self) -> LoopOutbox:
        if self._outbox is None:
            outbox = LoopOutbox(asyncio.get_running_loop())
            self._stream = await asyncio.to_thread(self._submit, outbox)
            self._outbox = outbox
            if self._cancelled:
                self._stream.cancel()
        return self._outbox

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        if self.result is not None:
            raise StopAsyncIteration
        try:
            outbox = await self._started()
            while True:
                _, (kind, *payload) = await outbox.queue.get()
                if kind == "text":
                    piece, ids, logprobs = payload
                    self.tokens += ids
                    self.logprobs += logprobs or []
                    self.text += piece
                    if piece:
                        return piece
                elif kind == "done":
                    self.result = payload[0]
                    raise StopAsyncIteration
                else:
                    raise payload[0]
        except asyncio.CancelledError:  # the task awaiting it was cancelled: so is the request
            self.cancel()
            raise

    async def wait(self) -> GenerationResult:
        async for _ in self:
            pass
        return self.result

    def cancel(self) -> None:
        self._cancelled = True
        if self._stream is not None:
            self._stream.cancel()

    async def aclose(self) -> None:
        if self.result is None:
            self.cancel()

    async def __aenter__(self):
        await self._started()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def __del__(self):
        if self.result is None and self._stream is not None:
            self._stream.cancel()
