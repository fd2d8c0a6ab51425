"""`specedge chat`: a conversation in the terminal. Each turn sends the whole conversation; the prompt cache
prefills only the new turn, so a long conversation answers as fast as its first question.

Commands at the prompt: /reset (a new conversation), /exit (or Ctrl+D, or Ctrl+C). Ctrl+C during a reply stops
the reply and keeps what it said so far. A message spans several lines between two lines of three double quotes
(pasted code), or where a line ends with a backslash."""

from __future__ import annotations

import sys
import time

import click

from specedge.errors import SpecedgeError
from specedge.interrupts import interrupt_handled
from specedge.runtime.reasoning import ReasoningStream, prompt_opens_thinking, template_thinks

HELP = ('/reset starts a new conversation, /exit (or Ctrl+D) ends; Ctrl+C stops a reply; several lines: between two '
        '""" lines, or end a line with \\')
BLOCK = '"""'


def turn_line(stats, first_token_s: float | None) -> str:
    """One line per reply: speed, time to first token, how much of the prompt the cache held, speculation."""
    s = stats
    first = f", first token {first_token_s:.2f}s" if first_token_s is not None else ""
    spec = f", accepted length {s.mean_accepted_length:.2f}" if s.n_verify else ""
    return (f"[{s.new_tokens} tokens, {s.tokens_per_s:.1f} tok/s{first}; prompt {s.prompt_tokens} tokens, "
            f"{s.cached_prompt_tokens} from the cache{spec}]")


def run_chat(gen, system: str | None, options: dict, show_stats: bool = True, read=None) -> None:
    """The loop: read a message, stream the reply, keep both in the conversation."""
    read = read or (lambda: input("> " if sys.stdin.isatty() else ""))
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    if sys.stdin.isatty():
        click.echo(HELP, err=True)
    while True:
        try:
            line = read_message(read)
        except (EOFError, KeyboardInterrupt):
            click.echo(err=True)
            return
        except UnicodeDecodeError:
            click.echo("(that input is not valid UTF-8: skipped)", err=True)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            messages = list(start)
            click.echo("(a new conversation)", err=True)
            continue
        messages.append({"role": "user", "content": line})
        try:
            reply, first_token_s = _reply(gen, messages, options)
        except SpecedgeError as err:             # e.g. the conversation outgrew max_seq_len: the session goes on
            messages.pop()
            click.echo(f"specedge: {err} (the message was dropped; /reset starts a new conversation)", err=True)
            continue
        messages.append({"role": "assistant", "content": reply.text})
        if show_stats:
            click.echo(turn_line(reply.stats, first_token_s), err=True)


def read_message(read) -> str:
    """One message: a line; the lines between two lines of three double quotes; a line ending with a backslash
    and the next ones. EOF inside a message ends it there."""
    first = read()
    if first.strip() == BLOCK:
        lines = []
        try:
            while (line := read()).strip() != BLOCK:
                lines.append(line)
        except EOFError:
            pass
        return "\n".join(lines)
    lines = [first]
    try:
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            lines.append(read())
    except EOFError:
        pass
    return "\n".join(lines)


def _reply(gen, messages: list[dict], options: dict):
    """Streams one reply -> (result, seconds to its first text). Ctrl+C cancels it: what it said so far stays. A
    reasoning model's thinking (<think>...</think>, where the template has it) is shown dimmed, apart from the
    answer."""
    t = time.perf_counter()
    first = None
    ids = gen.encode_messages(messages)
    thinking = (ReasoningStream(prompt_opens_thinking(gen.decode(ids[-16:])))
                if template_thinks(gen.chat_template) else None)
    stream = gen.stream_ids(ids, **options)

    shown = {"thought": False, "answer": False}

    def show(thought: str, answer: str) -> None:
        if thought:
            click.echo(click.style(thought, dim=True), nl=False)
            shown["thought"] = True
        if answer:
            new_line = shown["thought"] and not shown["answer"]     # the answer starts below the thinking
            click.echo("\n" * new_line + answer, nl=False)
            shown["answer"] = True

    try:
        for piece in stream:
            if piece and first is None:
                first = time.perf_counter() - t
            show(*(thinking.feed(piece) if thinking else ("", piece)))
    except KeyboardInterrupt:                       # stop the reply (wherever Ctrl+C landed); show what it said
        stream.cancel()
        interrupt_handled()
        for piece in stream:
            show(*(thinking.feed(piece) if thinking else ("", piece)))
    if thinking:
        show(*thinking.finish())
    click.echo()
    return stream.result, first
