"""Ctrl+C in the command line: noted, so that main reports it as an interruption whatever exception it turned into
on its way out (it can land inside a library's import or cleanup); and forgotten again by a command that handled
it and went on (`specedge chat` stops a reply and keeps the conversation)."""

from __future__ import annotations

import signal
import threading


class InterruptWatch:
    """Notes a Ctrl+C, then raises KeyboardInterrupt as Python's own handler does."""

    active: "InterruptWatch | None" = None

    def __init__(self):
        self.seen, self.previous = False, None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.previous = signal.signal(signal.SIGINT, self._on_interrupt)
            InterruptWatch.active = self

    def _on_interrupt(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            InterruptWatch.active = None


def interrupt_handled() -> None:
    """The Ctrl+C seen so far was handled: a later error is reported as itself, not as an interruption."""
    if InterruptWatch.active is not None:
        InterruptWatch.active.seen = False
