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
    where the stream is first awaited (and again to whoever awaits it again). `cancel()` (never blocking, from any
    thread), leaving an `async with` block, `await stream.aclose()` or cancelling a task that awaits it ends the
    request at the next step boundary (stop_reason "cancelled"); breaking out of an `async for` alone does not until
    the stream is closed or dropped. Several tasks may read it: one at a time, each piece goes to one of them, and
    all of them see the end (a Stop button's task: `cancel()`, then `await wait()`)."""

    def __init__(self, submit):
        self._submit = submit           # (outbox) -> the runtime's Stream, submitted with that outbox
        self._submission = None         # the future of that call, run in a thread once, whoever awaits first
        self._stream = None             # the Stream it returned (it cancels)
        self._outbox: LoopOutbox | None = None
        self._reading = asyncio.Lock()  # one reader of the outbox at a time; the end stays for the next
        self._cancelled = False
        self._error: BaseException | None = None
        self.result: GenerationResult | None = None
        self.tokens: list[int] = []     # ids received so far
        self.logprobs: list = []        # their TokenLogprobs, when the request asked for them
        self.text = ""

    async def _started(self) -> LoopOutbox:
        if self._submission is None:
            loop = asyncio.get_running_loop()
            self._outbox = LoopOutbox(loop)
            self._submission = loop.run_in_executor(None, self._submit, self._outbox)
            self._submission.add_done_callback(self._submitted)
        try:
            # shielded: a task cancelled while the request is being submitted leaves the submission to finish,
            # and _submitted cancels what it made
            await asyncio.shield(self._submission)
        except asyncio.CancelledError:
            self.cancel()
            raise
        except Exception as err:        # an OptionError, QueueFull, ...: kept for whoever awaits again
            self._error = err
            raise
        return self._outbox

    def _submitted(self, future) -> None:
        if not future.cancelled() and future.exception() is None:
            self._stream = future.result()
            if self._cancelled:
                self._stream.cancel()

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        try:
            async with self._reading:
                if self._error is not None:
                    raise self._error
                if self.result is not None:
                    raise StopAsyncIteration
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
                        self._error = payload[0]
                        raise self._error
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
