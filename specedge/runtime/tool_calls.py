"""Tool calls in a model's reply: the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks that the
chat templates of Qwen2.5, Qwen3 and Hermes-style models ask for (the format the template describes to the model
when it is given `tools`). Other formats (Llama 3.1's bare JSON, Mistral's [TOOL_CALLS]) are not parsed.

    content, calls = split_tool_calls(result.text)   # calls: [ToolCall(name, arguments JSON text)]
"""

from __future__ import annotations

import json
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str              # the arguments object as JSON text (what OpenAI's API carries)


def template_calls_tools(template: str | None) -> bool:
    """Whether a chat template renders `tools` and asks for calls in the <tool_call> format parsed here."""
    return bool(template) and "tools" in template and OPEN in template


def split_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """A reply -> (its text before the first call, or None if there is none; the calls). Each call is the JSON
    object after an opening tag (read as JSON, so a tag inside an argument string is just text), then its closing
    tag (optional at the very end). A reply whose calls do not all parse as objects with a string "name" is returned
    whole as text with no calls (as vLLM's parser does): a call cut off by max_tokens or a malformed one reaches the
    client as text, not as a broken call. Text after the last call is dropped."""
    head, found, _ = text.partition(OPEN)
    if not found:
        return text, []
    calls, at = [], len(head)
    while at < len(text):
        try:
            call, end = _DECODER.raw_decode(text, _skip_space(text, at + len(OPEN)))
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        arguments = call.get("arguments", call.get("parameters"))
        if not isinstance(arguments, str):
            arguments = json.dumps({} if arguments is None else arguments, ensure_ascii=False)
        calls.append(ToolCall(call["name"], arguments))
        end = _skip_space(text, end)
        if text.startswith(CLOSE, end):
            end = _skip_space(text, end + len(CLOSE))
        elif end < len(text):
            return text, []                            # something other than the closing tag after the object
        following = text.find(OPEN, end)                # text between calls is dropped, as after the last
        at = following if following >= 0 else len(text)
    return head or None, calls


_DECODER = json.JSONDecoder()


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


class ToolCallStream:
    """Streams a reply's text up to its first tool call: `feed` returns what can be sent now, holding back an end
    that may be the start of "<tool_call>"; from the call on everything is held; `finish` returns (the text still to
    send, the calls). If the held calls do not parse, finish sends them as text."""

    def __init__(self):
        self.text, self.sent, self.calling = "", 0, False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.calling:
            return ""
        at = self.text.find(OPEN, self.sent)
        if at >= 0:
            self.calling = True
            return self._send(at)
        keep = next((n for n in range(min(len(OPEN) - 1, len(self.text) - self.sent), 0, -1)
                     if self.text.endswith(OPEN[:n])), 0)
        return self._send(len(self.text) - keep)

    def _send(self, upto: int) -> str:
        out, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        calls = split_tool_calls(self.text)[1]
        if not calls:
            return self._send(len(self.text)), []
        return "", calls
