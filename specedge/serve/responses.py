"""OpenAI's Responses API (POST /v1/responses) on top of the chat path: a request body becomes a chat request (the
same checks, options and extensions), and the reply becomes a Response object, or its stream of typed events.

Text in and out: `input` (a string, or messages whose content is text or input_text / output_text parts),
`instructions`, `max_output_tokens`, `temperature`, `top_p`, `text.format` (text, json_object, json_schema),
`stream`, `metadata`; a thinking template's reasoning comes as a reasoning item before the message. Nothing is
stored, so `store` must be false or left out and `previous_response_id` is refused; tools, images and files are
refused with a 400 that says to use /v1/chat/completions (tools) or that they are not supported.
"""

from __future__ import annotations

import json
import time

from specedge.serve import protocol
from specedge.serve.errors import APIError, invalid, unsupported

# Responses parameter -> its chat-completions name; the rest of a body passes through (the chat path's checks
# refuse what neither API knows)
_RENAMED = {"max_output_tokens": "max_completion_tokens"}
_OWN = {"input", "instructions", "text", "store", "previous_response_id", "reasoning", "truncation", "include",
        "background", "max_tool_calls", "tools", "tool_choice", "top_logprobs", "conversation", "prompt"}
# accepted at these values only (their defaults, which clients send anyway)
_DEFAULT_ONLY = {"store": (None, False), "previous_response_id": (None,), "reasoning": (None, {}),
                 "truncation": (None, "disabled"), "include": (None, []), "background": (None, False),
                 "max_tool_calls": (None,), "tools": (None, []), "tool_choice": (None, "auto", "none"),
                 "top_logprobs": (None, 0), "conversation": (None,), "prompt": (None,)}
_WHY = {"store": " (nothing is stored: send store false)", "previous_response_id": " (nothing is stored: send the "
        "whole conversation as input)", "tools": " on /v1/responses (use /v1/chat/completions for tool calling)",
        "tool_choice": " (no tools on /v1/responses)"}
INCOMPLETE = ("max_new_tokens", "max_seq_len", "timeout")        # stop reasons of an incomplete response
# chat-completions parameter names in errors -> the Responses request's
_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format"}


def chat_body(body) -> dict:
    """A Responses request body -> the chat-completions body that runs it."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    for name, accepted in _DEFAULT_ONLY.items():
        if name in body and body[name] not in accepted:
            raise unsupported(name, body[name], _WHY.get(name, ""))
    for name in ("max_tokens", "max_completion_tokens", "messages", "response_format", "n"):
        if name in body:                             # the chat API's names: a Responses body has its own
            raise APIError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")
    chat = {_RENAMED.get(key, key): value for key, value in body.items() if key not in _OWN}
    messages = _instructions(body.get("instructions")) + _messages(body.get("input"))
    chat["messages"] = messages
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def renamed(err: APIError) -> APIError:
    """A chat-path error about a renamed parameter, named as the Responses request names it."""
    if err.param in _PARAMS:
        err.param = _PARAMS[err.param]
    return err


def _instructions(instructions) -> list[dict]:
    if instructions is None:
        return []
    if not isinstance(instructions, str):
        raise invalid("'instructions' must be a string", "instructions")
    return [{"role": "system", "content": instructions}]


def _messages(items) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise invalid("'input' must be a string or a non-empty list of messages", "input")
    return [_message(item, i) for i, item in enumerate(items)]


def _message(item, i: int) -> dict:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise invalid(f"{where} must be an object", where)
    kind = item.get("type", "message")
    if kind != "message":
        raise unsupported(f"{where}.type", kind, " (messages only: tool calls run on /v1/chat/completions)")
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        raise unsupported(f"{where}.role", role, " (roles: user, assistant, system, developer)")
    unknown = sorted(set(item) - {"type", "role", "content", "id", "status"})
    if unknown:
        raise unsupported(f"{where}.{unknown[0]}", item[unknown[0]])
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of text parts", f"{where}.content")
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            shown = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise unsupported(f"{where}.content[{j}]", f"a '{shown}' part", " (text parts only)")
        parts.append({"type": "text", "text": part["text"]})
    return {"role": role, "content": parts}


def _format(text) -> dict | None:
    """`text.format` -> the chat API's response_format (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise invalid("'text' takes 'format'", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise unsupported("text.verbosity", text["verbosity"])
    fmt = text.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise invalid("'text.format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}",
                      "text.format")
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
    return {"type": "json_schema", "json_schema": schema}


# -- what goes back --------------------------------------------------------------------------------
class Shape:
    """The ids and echoed settings of one response, and its objects and events as it goes."""

    def __init__(self, body: dict, req: protocol.ParsedRequest):
        self.body, self.req = body, req
        self.id = f"resp_{req.id}"
        self.message_id, self.reasoning_id = f"msg_{req.id}", f"rs_{req.id}"
        self.created = int(time.time())
        self.sequence = 0

    def response(self, status: str, output: list[dict], usage: dict | None = None, stop: str | None = None,
                 spec: dict | None = None) -> dict:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if stop in INCOMPLETE else None
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "error": None, "incomplete_details": incomplete, "model": self.req.model, "output": output,
               "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
               "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
               "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "store": False,
               "text": body.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
               "metadata": body.get("metadata") or {}, "usage": usage}
        if spec is not None:
            out["speculation"] = spec
        return out

    def reasoning_item(self, text: str, status: str = "completed") -> dict:
        return {"type": "reasoning", "id": self.reasoning_id, "status": status, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    def message_item(self, text: str | None, status: str = "completed") -> dict:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def output(self, thought: str | None, text: str) -> list[dict]:
        """A finished reply's output items: its reasoning (where it thought), then its message."""
        return ([self.reasoning_item(thought)] if thought else []) + [self.message_item(text)]

    def event(self, kind: str, **fields) -> str:
        """One SSE event: its type named in the event line and in the data, with a sequence number."""
        self.sequence += 1
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class Events:
    """A streamed reply as the Responses API's events: each output item opened when its first text comes (the
    reasoning item, then the message), its deltas, and its done events once the next one opens or the reply ends."""

    def __init__(self, shape: Shape):
        self.shape = shape
        self.thought, self.text = "", ""
        self.open: str | None = None                # "reasoning" or "message": the item taking deltas
        self.items = 0                              # output items opened so far

    def start(self) -> list[str]:
        response = self.shape.response("in_progress", [])
        return [self.shape.event("response.created", response=response),
                self.shape.event("response.in_progress", response=response)]

    def reasoning(self, delta: str) -> list[str]:
        out = [] if self.open == "reasoning" else self._open("reasoning")
        self.thought += delta
        return out + [self.shape.event("response.reasoning_text.delta", item_id=self.shape.reasoning_id,
                                       output_index=self.items - 1, content_index=0, delta=delta)]

    def message(self, delta: str) -> list[str]:
        out = [] if self.open == "message" else self._open("message")
        self.text += delta
        return out + [self.shape.event("response.output_text.delta", item_id=self.shape.message_id,
                                       output_index=self.items - 1, content_index=0, delta=delta, logprobs=[])]

    def finish(self) -> list[str]:
        """The done events of what is open; a reply with no answer text still gets its (empty) message."""
        out = [] if self.open == "message" else self._open("message")
        return out + self._close()

    def _open(self, kind: str) -> list[str]:
        out = self._close()
        self.open, self.items = kind, self.items + 1
        shape, index = self.shape, self.items - 1
        if kind == "reasoning":
            item = {**shape.reasoning_item("", "in_progress"), "content": []}
            return out + [shape.event("response.output_item.added", output_index=index, item=item)]
        return out + [shape.event("response.output_item.added", output_index=index,
                                  item=shape.message_item(None, "in_progress")),
                      shape.event("response.content_part.added", item_id=shape.message_id, output_index=index,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": []})]

    def _close(self) -> list[str]:
        shape, index, kind, self.open = self.shape, self.items - 1, self.open, None
        if kind == "reasoning":
            return [shape.event("response.reasoning_text.done", item_id=shape.reasoning_id, output_index=index,
                                content_index=0, text=self.thought),
                    shape.event("response.output_item.done", output_index=index,
                                item=shape.reasoning_item(self.thought))]
        if kind == "message":
            part = {"type": "output_text", "text": self.text, "annotations": []}
            return [shape.event("response.output_text.done", item_id=shape.message_id, output_index=index,
                                content_index=0, text=self.text, logprobs=[]),
                    shape.event("response.content_part.done", item_id=shape.message_id, output_index=index,
                                content_index=0, part=part),
                    shape.event("response.output_item.done", output_index=index, item=shape.message_item(self.text))]
        return []


def usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens}


def status(stop: str) -> str:
    return "incomplete" if stop in INCOMPLETE else "completed"
