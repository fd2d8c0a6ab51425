"""The caller's end of a request: an iterator of text pieces, then the result; closing it cancels the request."""

from __future__ import annotations

import queue
import threading

from specedge.errors import SpecedgeError
from specedge.runtime.sequences import GenerationResult, Sequence


class Stream:
    """Iterate for text pieces as tokens are committed; `result` holds the GenerationResult once it ends.
    `cancel()` / `close()` (from any thread, never blocking), leaving a `with` block or dropping the iterator early
    ends the request: its slot is free at the next step boundary, and the result's stop_reason is "cancelled";
    `wait()` returns that result (also while another thread iterates)."""

    def __init__(self, seq: Sequence, scheduler):
        self._seq, self._scheduler = seq, scheduler
        self.result: GenerationResult | None = None
        self.tokens: list[int] = []                 # ids received so far
        self.logprobs: list = []                    # their TokenLogprobs, when the request asked for them
        self._error: Exception | None = None
        self._reading = threading.Lock()            # held while a thread reads the outbox (see __next__)

    def scored_prompt(self) -> list | None:
        """The prompt's TokenLogprobs (a request with prompt_logprobs) as far as its prefill has scored them, all of
        them once a token has been committed; None for a request that did not ask. Safe from any thread."""
        scores = self._seq.prompt_logprobs
        return None if scores is None else list(scores)

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.result is None and self._error is None and self._scheduler.in_step():
            # an on_token callback: the step it would wait for is the one running it
            raise SpecedgeError("a stream cannot be read from an on_token callback (it runs inside a step); "
                                "cancel() it there")
        with self._reading:                              # one reader at a time: a thread that waits while another
            return self._next_piece()                    # iterates finds the end it read, never waits for it

    def _next_piece(self) -> str:
        if self._error is not None:                      # raised again to whoever asks again (wait() after a loop)
            raise self._error
        try:
            while self.result is None:
                try:
                    kind, *payload = self._seq.outbox.get(block=self._scheduler.background)
                except queue.Empty:
                    self._scheduler.pump(self._seq)      # drive the batch, or wait for whoever drives it
                    continue
                if kind == "text":
                    piece, ids, logprobs = payload
                    self.tokens += ids
                    self.logprobs += logprobs or []
                    if piece:
                        return piece
                elif kind == "done":
                    self.result = payload[0]
                else:
                    self._error = payload[0]
                    raise self._error
        except KeyboardInterrupt:                        # the caller is gone: its request must not run on
            self.cancel()
            raise
        raise StopIteration

    def wait(self) -> GenerationResult:
        """Drains the stream -> the result. Safe while another thread iterates (a Stop button's thread: cancel(),
        then wait()): the pieces go to whichever thread reads first, and both see the end."""
        for _ in self:
            pass
        return self.result

    def cancel(self) -> None:
        """Ends the request at the next step boundary; returns at once (safe from any thread)."""
        self._seq.cancelled.set()

    # close() does not wait for the result: a Stop handler holding a lock its on_token callback takes, a signal
    # handler on the reading thread, or a stream whose events go to another outbox would wait for ever
    close = cancel

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.result is None and self._error is None:
            self.cancel()

    def __del__(self):
        if self.result is None and not self._seq.done:
            self._seq.cancelled.set()
