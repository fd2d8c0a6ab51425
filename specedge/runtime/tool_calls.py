"""Tool calls in a model's reply: the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks that the
chat templates of Qwen2.5, Qwen3 and Hermes-style models ask for (the format the template describes to the model
when it is given `tools`). Small models often leave the tags out and answer with the call's JSON alone, in a
markdown fence or not (the real Qwen2.5-Coder-1.5B-Instruct did, every time it was tried here): given the tool
names, a reply that is nothing but such an object (or a list of them) naming a given tool is read as the call.
Other formats (Mistral's [TOOL_CALLS], Llama 3.1's python_tag) are not parsed.

    content, calls = split_tool_calls(result.text, names)   # calls: [ToolCall(name, arguments JSON text)]
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specedge.runtime.text import partial_tag

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str              # the arguments object as JSON text (what OpenAI's API carries)


def template_calls_tools(template: str | None) -> bool:
    """Whether a chat template renders `tools` and asks for calls in the <tool_call> format parsed here."""
    return bool(template) and "tools" in template and OPEN in template


def tool_names(tools: list[dict] | None) -> frozenset[str]:
    return frozenset(tool["function"]["name"] for tool in tools or ())


def split_tool_calls(text: str, names: frozenset[str] = frozenset()) -> tuple[str | None, list[ToolCall]]:
    """A reply -> (its text before the first call, or None if there is none; the calls). Each call is the JSON
    object after an opening tag (read as JSON, so a tag inside an argument string is just text), then its closing
    tag (optional at the very end). A reply whose calls do not all parse as objects with a string "name" is returned
    whole as text with no calls (as vLLM's parser does): a call cut off by max_tokens or a malformed one reaches the
    client as text, not as a broken call. Text after the last call is dropped. names: the tools given, for a reply
    that is a bare call (see the module's docstring)."""
    head, found, _ = text.partition(OPEN)
    if not found:
        return bare_calls(text, names)
    calls, at = [], len(head)
    while at < len(text):
        try:
            value, end = _DECODER.raw_decode(text, _skip_space(text, at + len(OPEN)))
        except ValueError:
            return text, []
        call = _call(value)
        if call is None:
            return text, []
        calls.append(call)
        end = _skip_space(text, end)
        if text.startswith(CLOSE, end):
            end = _skip_space(text, end + len(CLOSE))
        elif end < len(text):
            return text, []                            # something other than the closing tag after the object
        following = text.find(OPEN, end)                # text between calls is dropped, as after the last
        at = following if following >= 0 else len(text)
    return head or None, calls


def bare_calls(text: str, names: frozenset[str]) -> tuple[str | None, list[ToolCall]]:
    """A reply that is only a call's JSON object (or a list of them), bare or in a ```json fence, each naming one of
    `names` and holding nothing but "name" and "arguments" (or "parameters") -> (None, the calls); else (text, [])."""
    body = text.strip()
    if body.startswith(FENCE) and body.endswith("```") and len(body) > len(FENCE) + 3:
        body = body[len(FENCE):-3].strip()
    if not names or body[:1] not in ("{", "["):
        return text, []
    try:
        value = json.loads(body)
    except ValueError:
        return text, []
    items = value if isinstance(value, list) else [value]
    keys = {"name", "arguments", "parameters"}
    calls = [_call(item) for item in items if isinstance(item, dict) and set(item) <= keys]
    if not items or len(calls) != len(items) or any(c is None or c.name not in names for c in calls):
        return text, []
    return None, calls


def _call(value) -> ToolCall | None:
    """A call's JSON object -> ToolCall (arguments as JSON text, {} for none); None if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if not isinstance(arguments, str):
        arguments = json.dumps({} if arguments is None else arguments, ensure_ascii=False)
    return ToolCall(value["name"], arguments)


_DECODER = json.JSONDecoder()
FENCE = "```json"


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


class ToolCallStream:
    """Streams a reply's text up to its first tool call: `feed` returns what can be sent now, holding back an end
    that may be the start of "<tool_call>"; from the call on everything is held; `finish` returns (the text still to
    send, the calls). Given tool names, a reply that starts like a bare call ("{", "[" or a ```json fence) is held
    whole until it ends. If the held calls do not parse, finish sends them as text."""

    def __init__(self, names: frozenset[str] = frozenset()):
        self.text, self.sent, self.calling, self.names = "", 0, False, names
        self.bare = None if names else False        # None: not known yet whether the reply may be a bare call

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.bare is None:
            start = self.text.lstrip()
            if not start or (len(start) < len(FENCE) and FENCE.startswith(start)):
                return ""                             # too early to tell
            self.bare = start.startswith(("{", "[", FENCE))
        if self.calling or self.bare:
            return ""
        at = self.text.find(OPEN, self.sent)
        if at >= 0:
            self.calling = True
            return self._send(at)
        return self._send(len(self.text) - partial_tag(self.text, OPEN, self.sent))

    def _send(self, upto: int) -> str:
        out, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        calls = split_tool_calls(self.text, self.names)[1]
        if not calls:
            return self._send(len(self.text)), []
        return "", calls
