"""Reasoning models' thinking kept apart from their answer: the text between <think> and </think> (Qwen3, QwQ,
DeepSeek-R1 and its distills), returned as `reasoning_content` the way vLLM's reasoning parsers return it.

The block either opens in the reply itself (Qwen3 writes "<think>") or in the prompt (templates that end the
generation prompt with "<think>\\n", as DeepSeek-R1's distills do): `opened` says which.

    reasoning, content = split_reasoning(result.text, opened=False)
"""

from __future__ import annotations

from specedge.runtime.text import partial_tag

START, END = "<think>", "</think>"


def template_thinks(template: str | None) -> bool:
    return bool(template) and END in template


def prompt_opens_thinking(prompt_text: str) -> bool:
    """Whether the rendered prompt ends inside an opened <think> block (the reply then starts thinking at once)."""
    return prompt_text.rstrip().endswith(START)


def split_reasoning(text: str, opened: bool) -> tuple[str | None, str]:
    """A reply -> (its thinking, stripped, or None if it has none; the answer after it). A reply that does not
    start thinking (and was not opened by the prompt) is all answer; one cut off while thinking is all thinking."""
    start = text.lstrip()
    if start.startswith(START):                      # (opened: a reply that writes the tag again all the same)
        text = start[len(START):]
    elif not opened:
        return None, text
    reasoning, found, content = text.partition(END)
    return reasoning.strip() or None, content.lstrip() if found else ""


class ReasoningStream:
    """Splits a streamed reply as split_reasoning does: `feed` -> the (thinking, answer) text that can be sent now,
    `finish` -> the rest. What is sent is always a start of split_reasoning's final parts: an end that may still
    become a tag, and whitespace the final strip may drop, are held back."""

    def __init__(self, opened: bool):
        self.text, self.opened, self.sent = "", opened, ("", "")

    def _settled(self) -> tuple[str, str]:
        """The parts of the reply so far that more text cannot change."""
        start = self.text.lstrip()
        if len(start) < len(START) and START.startswith(start):
            return "", ""                            # not known yet whether it (re)opens the block
        if not self.opened and not start.startswith(START):
            return "", self.text
        reasoning, content = split_reasoning(self.text, self.opened)
        if END in self.text:
            return reasoning or "", content
        body = self.text[:len(self.text) - partial_tag(self.text, END)]
        return (split_reasoning(body, self.opened)[0] or ""), ""

    def _delta(self, parts: tuple[str, str]) -> tuple[str, str]:
        out = tuple(now[len(before):] for now, before in zip(parts, self.sent))
        self.sent = parts
        return out

    def feed(self, piece: str) -> tuple[str, str]:
        self.text += piece
        return self._delta(self._settled())

    def finish(self) -> tuple[str, str]:
        reasoning, content = split_reasoning(self.text, self.opened)
        return self._delta((reasoning or "", content))
