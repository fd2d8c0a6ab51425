"""Checking what a caller passes: generation options, prompts and token ids, each a one-line OptionError.

Types are checked, not coerced: `max_new_tokens="5"` or `seed=1.5` from a Python caller is a mistake to name,
not a value to guess at (bools are refused where a number is meant, numpy integers and floats are taken).
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import replace

from specedge.errors import OptionError
from specedge.runtime.chat import TEMPLATE_GLOBALS
from specedge.runtime.grammar import THINKING
from specedge.runtime.logprobs import MAX_TOP_LOGPROBS
from specedge.runtime.policies import make_policy
from specedge.runtime.sequences import DRAFTERS, GenerationOptions


def integer(name: str, value, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptionError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise OptionError(f"{name} must be {bound}, got {value}")
    return value


def real(name: str, value) -> float:
    try:
        finite = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    except OverflowError:                     # an integer too large for a float
        finite = False
    if not finite:
        raise OptionError(f"{name} must be a finite number, got {str(value)[:40]!r}")
    return float(value)


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be True or False, got {value!r}")
    return value


def checked_text(value, what: str = "the prompt") -> str:
    """A str that encodes to UTF-8 (a lone surrogate, e.g. from undecodable bytes on stdin, does not)."""
    if not isinstance(value, str):
        raise OptionError(f"{what} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise OptionError(f"{what} is not valid Unicode (a lone surrogate at character {err.start}; "
                          "undecodable bytes in the input?)") from None
    return value


def token_ids(ids, vocab_size: int) -> list[int]:
    """A prompt given as token ids: a sequence of integers in 0 .. vocab_size - 1."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise OptionError(f"prompt ids must be a list of integers, got {type(ids).__name__}")
    ids = list(ids)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise OptionError(f"prompt ids must be integers, got {i!r}")
        if not 0 <= i < vocab_size:
            raise OptionError(f"token id {int(i)} is outside the vocabulary (0..{vocab_size - 1})")
    return [int(i) for i in ids]


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


RESERVED_TEMPLATE_NAMES = ("messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "self",
                           *TEMPLATE_GLOBALS)


def template_kwargs(kwargs) -> dict:
    """Further chat-template variables: a dict of names to JSON-like values (None: none)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise OptionError("chat_template_kwargs must be a dict of variable names to values, "
                          f"got {type(kwargs).__name__}")
    if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise OptionError("chat_template_kwargs: every key must be a variable name")
    taken = [k for k in kwargs if k in RESERVED_TEMPLATE_NAMES]
    if taken:
        raise OptionError(f"chat_template_kwargs may not set '{taken[0]}' (the runtime or the template engine sets it)")
    return dict(kwargs)


def tool_definitions(tools) -> list[dict] | None:
    """OpenAI's `tools`: [{"type": "function", "function": {"name": str, "description"?: str, "parameters"?: {...}}}]
    -> the same, checked, `parameters` an empty object schema where absent (templates write it out; None or []:
    none)."""
    if not tools:
        return None
    if not isinstance(tools, list):
        raise OptionError("tools must be a list of {'type': 'function', 'function': {...}}, "
                          f"got {type(tools).__name__}")
    for j, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise OptionError(f"tools[{j}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise OptionError(f"tools[{j}].function.name must be a non-empty string")
        if not isinstance(function.get("parameters", {}), dict):
            raise OptionError(f"tools[{j}].function.parameters must be a JSON schema object")
    empty = {"type": "object", "properties": {}}
    return [{**tool, "function": {**tool["function"], "parameters": tool["function"].get("parameters", empty)}}
            for tool in tools]


def chat_messages(messages) -> list[dict]:
    """A conversation: a non-empty list of {"role": one of CHAT_ROLES, "content": str} ("developer" is rendered
    as "system", as OpenAI's newer name for it; an optional "name" str is kept). Tool use as OpenAI carries it:
    an assistant message's "tool_calls" and a "tool" message's "tool_call_id"; an assistant message's content may be
    None (a call, or a reply cut off while thinking)."""
    if isinstance(messages, (str, bytes, dict)) or not hasattr(messages, "__iter__"):
        raise OptionError("messages must be a list of {'role': ..., 'content': ...} dicts, "
                          f"got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise OptionError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        if m.get("role") not in CHAT_ROLES:
            raise OptionError(f"messages[{i}]['role'] must be one of {', '.join(CHAT_ROLES)}, got {m.get('role')!r}")
        calls = _tool_calls(m.get("tool_calls"), i) if m["role"] == "assistant" else []
        content = "" if m["role"] == "assistant" and m.get("content") is None else m.get("content")
        entry = {"role": "system" if m["role"] == "developer" else m["role"],
                 "content": checked_text(content, f"messages[{i}]['content']")}
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str):
                entry[key] = m[key]
        if calls:
            entry["tool_calls"] = calls
        out.append(entry)
    if not out:
        raise OptionError("messages is empty")
    return out


def _tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's OpenAI tool_calls -> what chat templates read: {"type", "id", "function": {"name",
    "arguments"}}, the arguments a dict where their JSON text is an object (as vLLM hands them to templates: Qwen's
    writes `arguments | tojson`)."""
    if calls is None:
        return []
    where = f"messages[{i}]['tool_calls']"
    if not isinstance(calls, list):
        raise OptionError(f"{where} must be a list")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise OptionError(f"{where}[{j}] must be {{'type': 'function', 'function': {{'name': str, "
                              "'arguments': str}}}")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except ValueError:
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else arguments
        out.append({"type": "function", "id": call.get("id"), "function": {"name": function["name"],
                                                                          "arguments": arguments}})
    return out


def stop_ids(ids) -> tuple[int, ...]:
    """Token ids that end generation: a sequence of non-negative integers (the vocabulary is checked by the
    generator, which knows its size)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise OptionError(f"stop_ids must be a list of token ids, got {ids!r}")
    return tuple(integer("each stop id", i, 0) for i in ids)


def stop_strings(stop) -> tuple[str, ...]:
    """One string is one stop string (not one per character); else an iterable of strings."""
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)):      # not bytes (iterated, ints), a dict (its keys) or a set (no order)
        raise OptionError(f"stop must be a string or a list of strings, got {stop!r}")
    stops = tuple(stops)
    for s in stops:
        checked_text(s, "each stop string")
    return tuple(s for s in stops if s)


def generation_options(options: dict, max_draft: int) -> GenerationOptions:
    """Keyword options -> validated GenerationOptions (every bound explicit)."""
    unknown = set(options) - set(GenerationOptions.__dataclass_fields__)
    if unknown:
        raise OptionError(f"unknown option(s): {', '.join(sorted(unknown))}")
    o = replace(GenerationOptions(), **options)
    temperature = real("temperature", o.temperature)
    if temperature < 0:
        raise OptionError(f"temperature must be >= 0, got {temperature}")
    top_p = real("top_p", o.top_p)
    if not 0.0 < top_p <= 1.0:
        raise OptionError(f"top_p must be in (0, 1], got {top_p}")
    policy, drafter = o.policy, o.drafter
    if policy is not None:
        if not isinstance(policy, str):
            raise OptionError(f"policy must be a name such as 'adaptive' or 'fixed:4', got {policy!r}")
        make_policy(policy, max_draft)          # validates the name
    if o.use_draft is False and policy not in (None, "target"):
        raise OptionError(f"use_draft=False (--no-draft) runs the target alone; policy '{policy}' would draft")
    if drafter not in DRAFTERS:
        raise OptionError(f"unknown drafter {drafter!r} (known: {', '.join(DRAFTERS)})")
    # k left out: the default, capped by what the bundle was exported for (a --max-draft 2 bundle runs k = 2);
    # a named policy decides k itself, so a given k is then only type-checked
    k = integer("k", o.k, 0) if "k" in options else min(o.k, max_draft)
    if k > max_draft and policy is None:
        raise OptionError(f"k must be between 0 and the bundle's max_draft {max_draft}, got {k}")
    return replace(
        o, max_new_tokens=integer("max_new_tokens", o.max_new_tokens, 1), temperature=temperature,
        top_k=integer("top_k", o.top_k, 0), top_p=top_p,
        seed=None if o.seed is None else integer("seed", o.seed, 0, 2**63 - 1),
        k=k, use_draft=flag("use_draft", o.use_draft), chat=flag("chat", o.chat),
        ignore_eos=flag("ignore_eos", o.ignore_eos), stop=stop_strings(o.stop), stop_ids=stop_ids(o.stop_ids),
        logprobs=None if o.logprobs is None else integer("logprobs", o.logprobs, 0, MAX_TOP_LOGPROBS),
        prompt_logprobs=None if o.prompt_logprobs is None else integer("prompt_logprobs", o.prompt_logprobs, 0,
                                                                       MAX_TOP_LOGPROBS),
        presence_penalty=_ranged("presence_penalty", o.presence_penalty, -2.0, 2.0),
        frequency_penalty=_ranged("frequency_penalty", o.frequency_penalty, -2.0, 2.0),
        repetition_penalty=_ranged("repetition_penalty", o.repetition_penalty, 0.0, 10.0, low_open=True),
        logit_bias=logit_bias(o.logit_bias), thinking=_thinking(o.thinking))


def _thinking(value) -> str | None:
    if value not in (None, *THINKING):
        raise OptionError(f"thinking must be one of {', '.join(THINKING)} (or None), got {value!r}")
    return value


def logit_bias(bias) -> dict | None:
    """OpenAI's logit_bias: {token id (an int, or its decimal string as JSON carries it): -100..100} -> {int: float}
    (the vocabulary is checked by the generator). None or {}: none."""
    if not bias:
        return None
    if not isinstance(bias, dict):
        raise OptionError(f"logit_bias must be a dict of token ids to numbers, got {type(bias).__name__}")
    out = {}
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else key
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise OptionError(f"logit_bias keys must be token ids, got {key!r}")
        token = int(token)
        out[token] = _ranged(f"logit_bias[{key}]", value, -100.0, 100.0)
    return out


def _ranged(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    value = real(name, value)
    if not (low < value if low_open else low <= value) or value > high:
        raise OptionError(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {value}")
    return value

