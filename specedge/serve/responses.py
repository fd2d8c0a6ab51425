"""OpenAI's Responses API (POST /v1/responses) on top of the chat path: a request body becomes a chat request (the same
checks, options and extensions), and the reply becomes a Response object, or its stream of typed events.

Text in and out: `input` (a string, or items: messages whose content is text or input_text / output_text parts,
function_call and function_call_output items, reasoning items, dropped), `instructions`, `max_output_tokens`,
`temperature`, `top_p`, `text.format` (text, json_object, json_schema), function `tools` with `tool_choice` and
`parallel_tool_calls`, `include` of the output text's logprobs with `top_logprobs`, `stream`, `metadata`; a thinking
template's reasoning comes as a reasoning item before the message, and the reply's tool calls as function_call items
after it. A finished response is kept (response_store.py) unless sent with `store` false, and `previous_response_id`
continues its conversation; other tool types, images and files are refused with a 400.
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
        "background", "max_tool_calls", "tools", "tool_choice", "top_logprobs", "conversation", "prompt",
        "stream_options", "prompt_cache_retention"}
# accepted at these values only (their defaults, which clients send anyway)
_DEFAULT_ONLY = {"reasoning": (None, {}),
                 "truncation": (None, "disabled"), "background": (None, False), "max_tool_calls": (None,),
                 "conversation": (None,), "prompt": (None,), "prompt_cache_retention": (None,)}
LOGPROBS = "message.output_text.logprobs"       # the one `include` value served
_WHY: dict[str, str] = {}
INCOMPLETE = ("max_new_tokens", "max_seq_len", "timeout")        # stop reasons of an incomplete response
# chat-completions parameter names in errors -> the Responses request's
_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format"}
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}


def chat_body(body, earlier: list[dict] = ()) -> tuple[dict, list[dict]]:
    """A Responses request body -> (the chat-completions body that runs it, the conversation's turns without the
    instructions: earlier, a stored response's, then the input's)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    if body.get("store") not in (None, True, False):
        raise invalid("'store' must be true or false", "store")
    for name, accepted in _DEFAULT_ONLY.items():
        value = body.get(name)
        if name == "reasoning" and isinstance(value, dict) and not any(v is not None for v in value.values()):
            continue                                 # {"effort": null, ...}: the defaults
        if name in body and value not in accepted:
            raise unsupported(name, value, _WHY.get(name, ""))
    for name in ("max_tokens", "max_completion_tokens", "messages", "response_format", "n", "logprobs"):
        if name in body:                             # the chat API's names: a Responses body has its own
            raise APIError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")
    _stream_options(body.get("stream_options"))
    logprobs = _include(body.get("include"))
    chat = {_RENAMED.get(key, key): value for key, value in body.items() if key not in _OWN}
    turns = [*earlier, *_messages(body.get("input"))]
    chat["messages"] = _instructions(body.get("instructions")) + turns
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("tools") not in (None, []):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    top = body.get("top_logprobs")
    if top not in (None, 0) and not logprobs:
        raise invalid(f"'top_logprobs' needs 'include': [\"{LOGPROBS}\"]", "top_logprobs")
    if logprobs:
        chat["logprobs"] = True
        if top is not None:
            chat["top_logprobs"] = top
    return chat, turns


def without_logprobs(response: dict) -> dict:
    """A response whose output_text parts leave their logprobs out (what the store keeps)."""
    def part(p: dict) -> dict:
        return {k: v for k, v in p.items() if k != "logprobs"}

    output = [{**item, "content": [part(p) for p in item["content"]]} if item.get("type") == "message" else item
              for item in response["output"]]
    return {**response, "output": output}


def check_retrieve(query: list[tuple[str, str]]) -> None:
    """GET /v1/responses/{id}'s query: what the official client sends, served as far as a kept response allows."""
    for key, value in query:
        if key == "stream" and value.lower() not in ("false", "0", ""):
            raise unsupported("stream", value, " (a kept response is returned whole)")
        if key == "starting_after":
            raise unsupported("starting_after", value, " (a kept response is returned whole)")
        if key in ("include", "include[]"):
            raise unsupported("include", value, " (kept responses keep no logprobs)" if value == LOGPROBS
                              else f" (only '{LOGPROBS}')")
        if key not in ("stream", "starting_after", "include", "include[]", "include_obfuscation"):
            raise APIError(400, f"Unrecognized query parameter: {key}", key, "unrecognized_argument")


def reply_turn(text: str, calls: list[dict]) -> dict:
    """A reply as the chat message a next turn carries (its thinking dropped, as templates drop it)."""
    turn = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _include(include) -> bool:
    """`include` -> whether the output text's logprobs were asked for (the only extra output served)."""
    if include is None:
        return False
    if not isinstance(include, list):
        raise invalid("'include' must be a list", "include")
    for value in include:
        if value != LOGPROBS:
            raise unsupported("include", value, f" (only '{LOGPROBS}')")
    return bool(include)


def _stream_options(options) -> None:
    """Responses' stream_options: only include_obfuscation, which pads deltas against length side channels on
    the wire; nothing here leaves the machine, so either value reads the same stream."""
    if options is None:
        return
    if not isinstance(options, dict) or set(options) - {"include_obfuscation"} or \
            options.get("include_obfuscation") not in (None, True, False):
        raise invalid("'stream_options' takes 'include_obfuscation' (true or false)", "stream_options")


def _known(item: dict, keys: set, where: str) -> None:
    """A 400 for a field the item should not have; fields a client sends as null are its defaults."""
    unknown = sorted(key for key in set(item) - keys if item[key] is not None)
    if unknown:
        raise unsupported(f"{where}.{unknown[0]}", item[unknown[0]])


def _tools(tools) -> list[dict]:
    """Responses' flat function tools -> the chat API's ({"type": "function", "function": {...}})."""
    if not isinstance(tools, list):
        raise invalid("'tools' must be a list of function tools", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise unsupported(f"tools[{i}].type", kind, " (function tools only)")
        _known(tool, _TOOL_KEYS, f"tools[{i}]")
        out.append({"type": "function", "function": {key: tool[key] for key in _TOOL_KEYS - {"type"}
                                                      if tool.get(key) is not None}})
    return out


def _tool_choice(choice):
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid("'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
                  "tool_choice")


def renamed(err: APIError) -> APIError:
    """A chat-path error about a renamed parameter, named as the Responses request names it."""
    if err.param in _PARAMS:
        chat_name, err.param = err.param, _PARAMS[err.param]
        err.message = err.message.replace(f"'{chat_name}'", f"'{err.param}'")
    return err


def _instructions(instructions) -> list[dict]:
    if instructions is None:
        return []
    if not isinstance(instructions, str):
        raise invalid("'instructions' must be a string", "instructions")
    return [{"role": "system", "content": instructions}]


def _messages(items) -> list[dict]:
    """`input` -> chat messages: a function_call item joins the assistant turn before it (or starts one), as the
    chat API carries calls; a function_call_output is a tool message; a reasoning item (a reply's thinking sent
    back, as the Agents SDK and Codex send a whole reply) is dropped, as templates drop earlier turns' thinking."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise invalid("'input' must be a string or a non-empty list of messages", "input")
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "function_call":
            call = _function_call(item, where)
            if messages and messages[-1]["role"] == "assistant":         # the same turn's text or calls
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_call_output(item, where))
        elif kind == "reasoning":
            continue
        elif kind in ("message", None):
            messages.append(_message(item, where))
        else:
            raise unsupported(f"{where}.type", kind, " (message, function_call, function_call_output and "
                                                     "reasoning items)")
    return messages


def _function_call(item: dict, where: str) -> dict:
    _known(item, {"type", "call_id", "name", "arguments", "id", "status"}, where)
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise invalid(f"{where}.{key} must be a string", f"{where}.{key}")
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                    "arguments": item["arguments"]}}


def _call_output(item: dict, where: str) -> dict:
    _known(item, {"type", "call_id", "output", "id", "status"}, where)
    if not isinstance(item.get("call_id"), str):
        raise invalid(f"{where}.call_id must be a string", f"{where}.call_id")
    output = item.get("output")
    if isinstance(output, list):                 # text parts
        output = _message({"role": "user", "content": output}, where)["content"]
    elif not isinstance(output, str):
        raise invalid(f"{where}.output must be a string or text parts", f"{where}.output")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _message(item, where: str) -> dict:
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant", "system", "developer"):
        raise unsupported(f"{where}.role", role, " (roles: user, assistant, system, developer)")
    _known(item, {"type", "role", "content", "id", "status", "phase"}, where)   # phase: informational
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

    def __init__(self, body: dict, req: protocol.ParsedRequest, turns: list[dict] = (), keep: bool = False):
        self.body, self.req, self.turns = body, req, list(turns)   # turns: the conversation before the reply
        self.keep = keep                                         # kept for previous_response_id (response_store.py)
        self.id = f"resp_{req.id}"
        self.message_id, self.reasoning_id = f"msg_{req.id}", f"rs_{req.id}"
        self.created = int(time.time())
        self.sequence = 0

    def response(self, status: str, output: list[dict], usage: dict | None = None, stop: str | None = None,
                 spec: dict | None = None) -> dict:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "error": None, "incomplete_details": incomplete, "model": self.req.model, "output": output,
               "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
               "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
               "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
               "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
               "store": self.keep, "previous_response_id": body.get("previous_response_id"),
               "top_logprobs": body.get("top_logprobs"),
               "text": body.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
               "metadata": body.get("metadata") or {}, "usage": usage}
        if spec is not None:
            out["speculation"] = spec
        return out

    def reasoning_item(self, text: str, status: str = "completed") -> dict:
        return {"type": "reasoning", "id": self.reasoning_id, "status": status, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    def message_item(self, text: str | None, status: str = "completed", logprobs: list | None = None) -> dict:
        """logprobs: the text's tokens' entries, where they were asked for."""
        part = {"type": "output_text", "text": text, "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        content = [] if text is None else [part]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def call_item(self, index: int, call: dict, status: str = "completed") -> dict:
        """call: one of the chat API's tool_calls (serve/tools.py's message_tool_calls)."""
        return {"type": "function_call", "id": f"fc_{self.req.id}_{index}", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}

    def output(self, thought: str | None, text: str, calls: list[dict] = (), status: str = "completed",
               logprobs: list | None = None) -> list[dict]:
        """A finished reply's output items: its reasoning (where it thought), its message (where it wrote text, or
        called nothing; "incomplete" where the reply was cut off), then its function calls."""
        message = [self.message_item(text, status, logprobs)] if text or not calls else []
        return ([self.reasoning_item(thought)] if thought else []) + message + \
            [self.call_item(i, call) for i, call in enumerate(calls)]

    def event(self, kind: str, **fields) -> str:
        """One SSE event: its type named in the event line and in the data, with a sequence number."""
        self.sequence += 1
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class Events:
    """A streamed reply as the Responses API's events: each output item opened when its first text comes (the
    reasoning item, then the message), its deltas, and its done events once the next one opens or the reply ends."""

    def __init__(self, shape: Shape, logprobs: bool = False):
        self.shape = shape
        self.thought, self.text = "", ""
        self.logprobs: list | None = [] if logprobs else None       # the text's tokens' entries, when asked for
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

    def message(self, delta: str, logprobs: list = ()) -> list[str]:
        out = [] if self.open == "message" else self._open("message")
        self.text += delta
        if self.logprobs is not None:
            self.logprobs += logprobs
        return out + [self.shape.event("response.output_text.delta", item_id=self.shape.message_id,
                                       output_index=self.items - 1, content_index=0, delta=delta,
                                       logprobs=list(logprobs))]

    def finish(self, calls: list[dict] = (), status: str = "completed") -> list[str]:
        """The done events of what is open, then each function call's (added, its arguments at once, done); a reply
        with neither answer text nor calls still gets its (empty) message. status: the message item's."""
        out = [] if self.open == "message" or self.text or calls else self._open("message")
        out += self._close(status)
        shape = self.shape
        for i, call in enumerate(calls):
            index, item = self.items, shape.call_item(i, call)
            self.items += 1
            out += [shape.event("response.output_item.added", output_index=index,
                                item={**item, "arguments": "", "status": "in_progress"}),
                    shape.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                delta=item["arguments"]),
                    shape.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                arguments=item["arguments"]),
                    shape.event("response.output_item.done", output_index=index, item=item)]
        return out

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

    def _close(self, status: str = "completed") -> list[str]:
        shape, index, kind, self.open = self.shape, self.items - 1, self.open, None
        if kind == "reasoning":
            return [shape.event("response.reasoning_text.done", item_id=shape.reasoning_id, output_index=index,
                                content_index=0, text=self.thought),
                    shape.event("response.output_item.done", output_index=index,
                                item=shape.reasoning_item(self.thought))]
        if kind == "message":
            item = shape.message_item(self.text, status, self.logprobs)
            return [shape.event("response.output_text.done", item_id=shape.message_id, output_index=index,
                                content_index=0, text=self.text, logprobs=self.logprobs or []),
                    shape.event("response.content_part.done", item_id=shape.message_id, output_index=index,
                                content_index=0, part=item["content"][0]),
                    shape.event("response.output_item.done", output_index=index, item=item)]
        return []


def usage(prompt_tokens: int, output_tokens: int, cached: int, reasoning_tokens: int = 0) -> dict:
    """reasoning_tokens: of the output, those of its thinking."""
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens}


def failed_code(status: int) -> str:
    """The code of a failed response's error, one of those OpenAI's ResponseError allows (the error event before
    it carries this server's own code)."""
    return "rate_limit_exceeded" if status == 429 else "server_error"


def status(stop: str) -> str:
    return "incomplete" if stop in INCOMPLETE else "completed"
