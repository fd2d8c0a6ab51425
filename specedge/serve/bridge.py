"""Where the HTTP side (one asyncio event loop) meets the batching loop (the generator's worker thread).

`Bridge.open` submits a request to the generator (background=True) with an outbox whose `put`, called on the
worker thread, hands each event to the event loop with `call_soon_threadsafe`; the request's `events()` is
then an async iterator of ("text", piece, ids, logprobs) events that ends with the GenerationResult. Nothing blocks the
event loop and no thread waits per request. Cancelling (a client that went away, a timeout, a task cancelled
at shutdown) sets the sequence's cancel flag: its slot is free at the next step boundary.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from specedge.runtime.async_stream import LoopOutbox
from specedge.runtime.sequences import GenerationResult


class RequestTimeout(Exception):
    """The request ran past its deadline; it was cancelled (its slot freed at the next step)."""

    def __init__(self, seconds: float, tokens: list[int], text: str):
        super().__init__(f"the request reached its timeout of {seconds:g} s")
        self.seconds, self.tokens, self.text = seconds, tokens, text


@dataclass(eq=False)                   # compared and hashed by identity (the server keeps a set of them)
class Request:
    """One submitted request, seen from the event loop."""
    stream: object                     # the runtime's Stream (used to cancel)
    outbox: LoopOutbox
    prompt_tokens: int
    arrived: float                     # time.perf_counter() when the request was submitted
    deadline: float | None = None      # perf_counter time after which the request is cancelled
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)   # perf_counter of each commit that carried tokens
    tokens: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)     # TokenLogprob per token in `tokens`, when asked for
    text: str = ""
    result: GenerationResult | None = None
    timed_out: bool = False
    cancelled_by: str | None = None    # why the server cancelled it ("shutdown"), if it did

    def cancel(self, reason: str | None = None) -> None:
        if reason and self.cancelled_by is None and self.result is None:
            self.cancelled_by = reason
        self.stream.cancel()

    async def events(self):
        """Yields ("text", piece, ids, logprobs of ids or None) as tokens are committed; the result is in .result
        when it ends.
        Raises the runtime's error if generation failed, RequestTimeout past the deadline. Leaving the iteration
        early (or being cancelled) cancels the request."""
        try:
            while True:
                timeout = None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())
                try:
                    # what already arrived is read first: a slow reader past the deadline still gets a request that
                    # finished in time (wait_for with no time left may not take an item that is already queued);
                    # text made after the deadline is the timeout, however soon it was read (the end that follows
                    # text made in time is not: settle() reads on to it)
                    item = self.outbox.queue.get_nowait() if not self.outbox.queue.empty() else None
                    made, (kind, *payload) = item or await asyncio.wait_for(self.outbox.queue.get(), timeout)
                    if kind == "text" and self.deadline is not None and made > self.deadline:
                        raise TimeoutError
                except (asyncio.TimeoutError, TimeoutError):
                    self.timed_out = True
                    self.cancel()
                    raise RequestTimeout(self.deadline - self.arrived, self.tokens, self.text) from None
                if kind == "text":
                    piece, ids, logprobs = payload
                    if ids:
                        now = time.perf_counter()
                        self.first_token_at = self.first_token_at or now
                        self.token_times.append(now)
                        self.tokens += ids
                        self.logprobs += logprobs or []
                    self.text += piece
                    yield kind, piece, ids, logprobs
                elif kind == "done":
                    self.result = payload[0]
                    return
                else:
                    raise payload[0]
        finally:
            if self.result is None:
                self.cancel()

    async def settle(self, grace: float = 5.0) -> GenerationResult | None:
        """After a cancel (a timeout): the runtime's final result, waited for up to `grace` seconds (it comes at the
        next step boundary) -> it, or None. Tokens committed after the cancel are not added to .tokens / .text."""
        if self.result is not None:
            return self.result
        end = time.perf_counter() + grace
        while True:
            try:
                _, (kind, *payload) = await asyncio.wait_for(self.outbox.queue.get(),
                                                             max(0.0, end - time.perf_counter()))
            except (asyncio.TimeoutError, TimeoutError):
                return None
            if kind == "done":
                self.result = payload[0]
                return self.result
            if kind == "error":
                return None

    async def wait(self) -> GenerationResult:
        async for _ in self.events():
            pass
        return self.result


class Bridge:
    """Submits requests to a background generator from the event loop it is created on."""

    def __init__(self, generator, loop: asyncio.AbstractEventLoop | None = None):
        if not generator.scheduler.background:
            raise ValueError("the bridge needs a generator loaded with background=True (a worker thread)")
        self.gen = generator
        self.loop = loop or asyncio.get_running_loop()

    def open(self, prompt_ids: list[int], timeout: float | None = None, **options) -> Request:
        """Submits a request -> Request. Raises what the generator raises (OptionError, QueueFull, SpecedgeError)
        before anything runs."""
        outbox = LoopOutbox(self.loop)
        arrived = time.perf_counter()
        stream = self.gen.stream_ids(prompt_ids, outbox=outbox, **options)
        return Request(stream, outbox, len(prompt_ids), arrived,
                       deadline=None if timeout is None else arrived + timeout)
