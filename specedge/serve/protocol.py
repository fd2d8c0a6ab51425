"""OpenAI request bodies -> the runtime's options, and results -> OpenAI response objects.

Every parameter OpenAI defines is either honoured, accepted at its default value (which clients send anyway),
or refused with a 400 naming it: nothing is ignored silently. Extensions: `top_k`, `ignore_eos`, `stop_token_ids`,
`repetition_penalty` (as vLLM), `speculation` ("off", or {"policy": "fixed:4" | "adaptive" | ..., "drafter": "model" |
"ngram" | "hybrid"}), `timeout` (seconds, at most the server's --request-timeout), `chat_template_kwargs` (as vLLM:
further variables for the chat template, e.g. {"enable_thinking": false} for Qwen3). Tool calling's side of a request
is serve/tools.py's.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from specedge.errors import OptionError, SpecedgeError
from specedge.runtime.grammar import grammar_of
from specedge.runtime.logprobs import MAX_TOP_LOGPROBS
from specedge.runtime.options import (CHAT_ROLES, checked_text, logit_bias, template_kwargs, token_ids,
                                      tool_definitions)
from specedge.runtime.reasoning import prompt_opens_thinking, split_reasoning, template_thinks
from specedge.runtime.tool_calls import ToolCall, split_tool_calls, tool_names
from specedge.serve.errors import APIError, invalid, unsupported
from specedge.serve.tools import forced_call, message_tool_calls, requested_tools

MAX_STOP = 4                  # OpenAI's limit
MAX_STOP_CHARS = 256
MAX_MESSAGES = 1024
COMPLETION_DEFAULT_MAX_TOKENS = 16      # OpenAI's default for /v1/completions (chat: whatever fits)
MAX_CHOICES = 128                       # 'n': each choice is a sequence of its own (a slot, or a place in the queue)

FINISH = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "max_seq_len": "length",
          "timeout": "length", "cancelled": "stop"}

_ANY = object()
# parameter -> the values accepted although not acted on (defaults): anything else is a 400
_DEFAULT_ONLY_COMMON = {"service_tier": (None, "auto", "default")}
_DEFAULT_ONLY = {
    "completion": {**_DEFAULT_ONLY_COMMON, "best_of": (None, 1)},
    "chat": {**_DEFAULT_ONLY_COMMON, "functions": (None, []), "function_call": (None, "none", "auto"),
             "store": (None, False), "modalities": (None, ["text"]),
             "audio": (None,), "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,),
             "verbosity": (None,)},
}
# accepted and without effect on the output (metadata for the caller's own bookkeeping)
# an assistant message's thinking as this server (or vLLM) returned it, sent back by a client: dropped, as thinking
# templates drop earlier turns' thinking anyway
ECHOED_THINKING = ("reasoning_content", "reasoning")
_METADATA = {"user", "metadata", "parallel_tool_calls", "safety_identifier", "prompt_cache_key"}
_HONOURED = {
    "completion": {"model", "prompt", "n", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
                   "stream_options", "top_k", "ignore_eos", "speculation", "timeout", "logprobs", "suffix", "echo",
                   "stop_token_ids", "response_format", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "logit_bias"},
    "chat": {"model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
             "stream", "stream_options", "top_k", "ignore_eos", "speculation", "timeout", "logprobs", "top_logprobs",
             "stop_token_ids", "chat_template_kwargs", "tools", "tool_choice", "response_format", "presence_penalty",
             "frequency_penalty", "repetition_penalty", "logit_bias"},
}
_WHY = {"best_of": " (use 'n' and choose among the choices)",
        "functions": " (the legacy form: use 'tools')", "function_call": " (the legacy form: use 'tool_choice')",
        "store": " (nothing is stored)"}


@dataclass
class Limits:
    """What the server will take (set from `specedge serve`'s options)."""
    model: str                               # the served model id
    policy: str = "adaptive"                 # default speculation (how many to draft)
    drafter: str = "model"                   # default drafter
    request_timeout: float | None = 600.0    # seconds, the most a request may run (None: no limit)
    max_messages: int = MAX_MESSAGES
    reasoning: bool = True                   # split <think> blocks into reasoning_content (where the template thinks)
    stored_responses: int = 256              # the Responses API's kept responses (0: none; response_store.py)


@dataclass
class ParsedRequest:
    kind: str                                # "completion" or "chat"
    model: str
    prompt_ids: list[int]
    options: dict                            # keyword options for Generator.stream_ids
    stream: bool = False
    include_usage: bool = False
    timeout: float | None = None
    speculation: str = ""                    # policy@drafter, for the log and the response
    n: int = 1                               # choices: sequences generated from the same prompt
    echo: bool = False                       # completions: the prompt before the text (and its tokens' logprobs)
    echo_only: bool = False                  # echo with max_tokens 0: the prompt alone (scored), no completion
    tools: frozenset = frozenset()           # the tools' names where the reply may call them (tool_choice auto)
    one_tool_call: bool = False              # parallel_tool_calls false: the first call only
    thinking: bool | None = None             # None: no reasoning split; else whether the prompt opened <think>
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    try:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)
    except OverflowError:                     # a JSON integer of hundreds of digits
        return False


def _number(body: dict, name: str, lo: float, hi: float, default, lo_open: bool = False):
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value) or value < lo or value > hi or (lo_open and value == lo):
        bracket = "(" if lo_open else "["
        raise invalid(f"'{name}' must be a number in {bracket}{lo:g}, {hi:g}], got {value!r}", name)
    return float(value)


def _integer(body: dict, name: str, lo: int, hi: int | None = None):
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        upper = f" and at most {hi}" if hi is not None else ""
        raise invalid(f"'{name}' must be an integer of at least {lo}{upper}, got {value!r}", name)
    return value


def _bool(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean, got {value!r}", name)
    return value


def _logprobs(body: dict, kind: str) -> int | None:
    """-> how many alternatives per token to return with its logprob (0: the token's own only), or None: none.
    Completions: `logprobs` 0..5 (the legacy API's limit); chat: `logprobs` true, `top_logprobs` 0..20."""
    if kind == "completion":
        return _integer(body, "logprobs", 0, 5)
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if not _bool(body, "logprobs"):
        if top:
            raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def _check_parameters(body: dict, kind: str) -> None:
    for name in body:
        if name in _METADATA:
            _check_metadata(body, name)
            continue
        if name in _HONOURED[kind]:
            continue
        if name in _DEFAULT_ONLY[kind]:
            if body[name] not in _DEFAULT_ONLY[kind][name]:
                raise unsupported(name, body[name], _WHY.get(name, ""))
            continue
        raise APIError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")


def _check_metadata(body: dict, name: str) -> None:
    """The bookkeeping fields have no effect here, but a wrong type is still the 400 OpenAI's API answers."""
    value = body[name]
    if value is None:
        return
    if name == "parallel_tool_calls":
        _bool(body, name)
    elif name == "metadata":
        if not isinstance(value, dict) or len(value) > 16 or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()):
            raise invalid("'metadata' must be an object of at most 16 string values (keys up to 64 characters, "
                          "values up to 512)", name)
    elif not isinstance(value, str):
        raise invalid(f"'{name}' must be a string, got {value!r}", name)


def _logit_bias(body: dict, vocab_size: int) -> dict | None:
    try:
        bias = logit_bias(body.get("logit_bias"))
        token_ids(list(bias or ()), vocab_size)
    except OptionError as err:
        raise invalid(str(err), "logit_bias") from None
    return bias


def _response_format(body: dict) -> dict | None:
    """text (the default), json_object or json_schema (OpenAI's shape): checked and compiled here, so that a bad
    schema is a 400 naming the parameter."""
    value = body.get("response_format")
    try:
        return value if grammar_of(value) is not None else None
    except OptionError as err:
        raise invalid(str(err), "response_format") from None


def _stop_ids(body: dict, vocab_size: int) -> tuple[int, ...]:
    """vLLM's extension: token ids that end generation as an eos id does."""
    ids = body.get("stop_token_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(_is_int(i) and 0 <= i < vocab_size for i in ids):
        raise invalid(f"'stop_token_ids' must be a list of token ids (0..{vocab_size - 1})", "stop_token_ids")
    return tuple(ids)


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP:
        raise invalid(f"'stop' takes at most {MAX_STOP} strings, got {len(stops)}", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise invalid(f"each 'stop' string may have at most {MAX_STOP_CHARS} characters", "stop")
    for s in stops:
        _unicode(s, "stop")
    return tuple(s for s in stops if s)


def _speculation(body: dict, limits: Limits) -> dict:
    spec = body.get("speculation")
    policy, drafter = limits.policy, limits.drafter
    if spec is None:
        pass
    elif spec in ("off", "target"):
        policy = "target"
    elif spec == "on":                     # the server's default, or adaptive where that default is not to draft
        policy = "adaptive" if policy == "target" else policy
    elif isinstance(spec, dict):
        unknown = set(spec) - {"policy", "drafter"}
        if unknown:
            raise invalid(f"'speculation' takes 'policy' and 'drafter', not {', '.join(sorted(unknown))}",
                          "speculation")
        if "policy" in spec:
            if not isinstance(spec["policy"], str):
                raise invalid("'speculation.policy' must be a string such as 'fixed:4', 'adaptive' or 'off'",
                              "speculation.policy")
            policy = "target" if spec["policy"] == "off" else spec["policy"]
        if "drafter" in spec:
            if spec["drafter"] not in ("model", "ngram", "hybrid"):
                raise invalid(f"'speculation.drafter' must be 'model', 'ngram' or 'hybrid', got {spec['drafter']!r}",
                              "speculation.drafter")
            drafter = spec["drafter"]
    else:
        raise invalid("'speculation' must be \"off\", \"on\" or an object {\"policy\": ..., \"drafter\": ...}",
                      "speculation")
    return {"policy": policy, "drafter": drafter}


def _unicode(value: str, param: str) -> str:
    """JSON may carry a lone surrogate ("\\ud800"), which is not text and which the tokenizer refuses."""
    try:
        return checked_text(value, f"'{param}'")
    except OptionError as err:
        raise invalid(str(err), param) from None


def prompt_ids_of(body: dict, gen) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                                   # a batch of one
    suffix = body.get("suffix")
    if suffix not in (None, ""):                            # fill in the middle: write what goes between the two
        if not isinstance(suffix, str):
            raise invalid("'suffix' must be a string", "suffix")
        if not isinstance(prompt, str):
            raise invalid("with 'suffix', 'prompt' must be text (the code before the gap)", "prompt")
        if gen.fim is None:
            raise APIError(400, "'suffix' (fill in the middle) needs fill-in-the-middle tokens, which this model's "
                                "tokenizer does not have", "suffix", "unsupported_parameter")
        return gen.encode(_unicode(prompt, "prompt"), suffix=_unicode(suffix, "suffix"))
    if isinstance(prompt, str):
        return gen.tokenizer.encode(_unicode(prompt, "prompt")).ids
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < gen.vocab_size]
        if bad:
            raise invalid(f"token id {bad[0]} is outside the vocabulary (0..{gen.vocab_size - 1})", "prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise unsupported("prompt", f"a list of {len(prompt)} prompts", " (one prompt per request)")
    raise invalid("'prompt' must be a string, a list of token ids, or a list holding one of those", "prompt")


def _message_text(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return _unicode(content, f"messages[{i}].content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported(f"messages[{i}].content", f"a '{kind}' part", " (text parts only)")
            parts.append(_unicode(part["text"], f"messages[{i}].content"))
        return "".join(parts)
    raise invalid(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def chat_ids(body: dict, gen, limits: Limits, tools: list[dict] | None) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", "messages")
    if len(messages) > limits.max_messages:
        raise invalid(f"'messages' may hold at most {limits.max_messages} messages, got {len(messages)}", "messages")
    if not gen.chat_template:
        raise invalid("this model's bundle has no chat template; use /v1/completions", "messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}] must be an object", f"messages[{i}]")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise unsupported(f"messages[{i}].role", role, " (roles: system, developer, user, assistant, tool)")
        known = {"role", "content", "name"} | (
            {"tool_calls", *ECHOED_THINKING} if role == "assistant" else {"tool_call_id"} if role == "tool" else set())
        # fields a client echoes back empty (the openai client's model_dump(): refusal, annotations, audio, ...)
        unknown = sorted(k for k in set(message) - known if message[k] not in (None, "", [], {}))
        if unknown:
            raise unsupported(f"messages[{i}].{unknown[0]}", message[unknown[0]])
        # the message as the runtime takes it (runtime.options.chat_messages): text parts joined; an assistant turn
        # with no text (a tool call, or a reply cut off while thinking) keeps its null content
        kept = known & message.keys() & {"role", "name", "tool_call_id", "tool_calls"}
        entry = {key: message[key] for key in kept}
        empty = role == "assistant" and message.get("content") is None
        rendered.append({**entry, "content": None if empty else _message_text(message, i)})
    for param, read in (("chat_template_kwargs", template_kwargs), ("tools", tool_definitions)):
        try:
            read(body.get(param))
        except OptionError as err:
            raise invalid(str(err), param) from err
    try:
        return gen.encode_messages(rendered, body.get("chat_template_kwargs"), tools)
    except OptionError as err:                        # a message's tool_calls in the wrong shape
        raise invalid(str(err), "messages") from err
    except SpecedgeError as err:                      # the template refused these messages (e.g. role order)
        raise invalid(str(err), "messages") from err


def served_model(model: str, limits: Limits) -> None:
    """A 404 in OpenAI's shape unless `model` is the one this server serves."""
    if model != limits.model:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{limits.model}'", "model",
                       "model_not_found")


def parse(body, kind: str, gen, limits: Limits) -> ParsedRequest:
    """A request body (decoded JSON) -> ParsedRequest; APIError for anything invalid or unsupported."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    _check_parameters(body, kind)
    model = body.get("model")
    if model is None or model == "":
        raise invalid("'model' is required (see GET /v1/models)", "model")
    if not isinstance(model, str):
        raise invalid(f"'model' must be a string such as '{limits.model}', got {type(model).__name__}", "model")
    served_model(model, limits)
    stream = _bool(body, "stream")
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage", "include_obfuscation"}:
            raise invalid("'stream_options' takes 'include_usage'", "stream_options")
        include_usage = _bool(stream_options, "include_usage")
        if _bool(stream_options, "include_obfuscation"):
            raise unsupported("stream_options.include_obfuscation", True)
    # echo with max_tokens 0 (as OpenAI's legacy API and vLLM): the prompt scored, nothing generated
    echo_only = kind == "completion" and body.get("echo") is True and body.get("max_tokens") == 0
    max_tokens = _integer(body, "max_tokens", 0 if echo_only else 1)
    if kind == "chat":
        max_tokens = _integer(body, "max_completion_tokens", 1) or max_tokens
    timeout = _number(body, "timeout", 0, limits.request_timeout or math.inf, None, lo_open=True)
    options = dict(temperature=_number(body, "temperature", 0, 2, 1.0),
                   top_p=_number(body, "top_p", 0, 1, 1.0, lo_open=True),
                   seed=_integer(body, "seed", 0, 2**63 - 1), stop=_stops(body),
                   top_k=max(0, _integer(body, "top_k", -1) or 0),          # -1 or 0: off (as vLLM)
                   ignore_eos=_bool(body, "ignore_eos"),
                   logprobs=_logprobs(body, kind), stop_ids=_stop_ids(body, gen.vocab_size),
                   response_format=_response_format(body),
                   presence_penalty=_number(body, "presence_penalty", -2, 2, 0.0),
                   frequency_penalty=_number(body, "frequency_penalty", -2, 2, 0.0),
                   repetition_penalty=_number(body, "repetition_penalty", 0, 10, 1.0, lo_open=True),
                   logit_bias=_logit_bias(body, gen.vocab_size),
                   **_speculation(body, limits))
    if options["policy"] == "target":
        options["drafter"] = "model"            # the runtime runs the target alone; no drafter to check
    tools = requested_tools(body, gen) if kind == "chat" else None
    forced = forced_call(body, tools)
    if forced is not None:
        if options["response_format"] is not None:
            raise invalid("'response_format' cannot be combined with a forced tool call", "response_format")
        try:
            grammar_of(forced)
        except OptionError as err:
            problem = str(err).removeprefix("response_format: ")     # grammar_of speaks of response formats
            raise invalid(f"the forced tool's parameters: {problem}", "tool_choice") from None
        options["response_format"] = forced
    prompt_ids = chat_ids(body, gen, limits, tools) if kind == "chat" else prompt_ids_of(body, gen)
    n, context = len(prompt_ids), gen.max_seq_len
    if n == 0:
        raise invalid("the prompt is empty after tokenization", "messages" if kind == "chat" else "prompt")
    if n >= context:
        raise invalid(f"This model's maximum context length is {context} tokens, and the prompt has {n} tokens "
                      "(no room left to generate)", "messages" if kind == "chat" else "prompt",
                      "context_length_exceeded")
    room = context - n
    if max_tokens is not None and max_tokens > room:
        raise invalid(f"This model's maximum context length is {context} tokens. However, you requested "
                      f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the completion)",
                      "max_completion_tokens" if kind == "chat" and "max_completion_tokens" in body else "max_tokens",
                      "context_length_exceeded")
    if max_tokens is None:
        max_tokens = min(COMPLETION_DEFAULT_MAX_TOKENS, room) if kind == "completion" else room
    options["max_new_tokens"] = max_tokens or 1            # echo only: one token is generated and left out
    if kind == "completion" and body.get("suffix") not in (None, ""):
        options["stop_ids"] = gen.fim_stop_ids(options["stop_ids"])
    echo = kind == "completion" and _echo(body, options)
    thinking = _thinking(kind, prompt_ids, gen, limits)
    if thinking is not None and options["response_format"] is not None:
        options["thinking"] = "opened" if thinking else "optional"     # the grammar holds after </think>
    label = options["policy"] if options["policy"] == "target" else f"{options['policy']}@{options['drafter']}"
    timeout = timeout if timeout is not None else limits.request_timeout
    return ParsedRequest(kind, model, prompt_ids, options, stream, include_usage, timeout, label,
                         n=_integer(body, "n", 1, MAX_CHOICES) or 1, echo=echo, echo_only=echo_only,
                         tools=tool_names(tools), one_tool_call=body.get("parallel_tool_calls") is False,
                         thinking=thinking)


def _echo(body: dict, options: dict) -> bool:
    """Completions' `echo`: the response text starts with the prompt and, with `logprobs`, the block scores every
    prompt token after the first (lm-evaluation-harness's loglikelihood requests); the generator then computes
    prompt_logprobs (without the prompt cache)."""
    if not _bool(body, "echo"):
        return False
    if body.get("suffix") not in (None, ""):
        raise invalid("'echo' cannot be combined with 'suffix'", "echo")
    if options["logprobs"] is not None:
        options["prompt_logprobs"] = options["logprobs"]
    return True


def _thinking(kind: str, prompt_ids: list[int], gen, limits: Limits) -> bool | None:
    """None: the reply is not split; else whether the rendered prompt left a <think> block open. Under a grammar
    (response_format, a forced tool call) the reply thinks first and the grammar holds after </think>, as vLLM's
    with a reasoning parser; with the parser off (--no-reasoning-parser) it holds from the first token."""
    if kind != "chat" or not limits.reasoning or not template_thinks(gen.chat_template):
        return None
    return prompt_opens_thinking(gen.decode(prompt_ids[-16:]))


# -- responses ---------------------------------------------------------------------------------
def finish_reason(stop_reason: str) -> str:
    return FINISH.get(stop_reason, "stop")


def speculation(stats, label: str, stop_reason: str | None = None) -> dict:
    s = stats.to_json()
    return {"policy": label, "drafted_tokens": s["drafted_tokens"], "accepted_tokens": s["accepted_tokens"],
            "acceptance_rate": s["acceptance_rate"], "mean_accepted_length": s["mean_accepted_length"],
            "acceptance_per_position": s["acceptance_per_position"], "verify_calls": s["verify_calls"],
            "target_calls": s["target_calls"], "draft_calls": s["draft_calls"], "k_mean": s["k_mean"],
            "stop_reason": stop_reason or s["stop_reason"]}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens the prompt cache held (not prefilled)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _prefix(req: ParsedRequest) -> str:
    return ("chatcmpl-" if req.kind == "chat" else "cmpl-") + req.id


def choice_options(req: ParsedRequest, index: int) -> dict:
    """The generator options of choice `index`: a seeded request's choices take seed, seed + 1, ... (reproducible,
    and not all the same when sampling)."""
    seed = req.options.get("seed")
    return req.options if seed is None or index == 0 else {**req.options, "seed": (seed + index) % 2**63}


@dataclass
class Choice:
    """One choice's end, as the response reports it."""
    text: str
    stop_reason: str
    logprobs: dict | None = None             # already in the request kind's shape (serve/logprobs.py)


def _call_ids(req: ParsedRequest, index: int) -> str:
    """What the tool-call ids of choice `index` are made from: unique in the request (choice 0 as with n = 1)."""
    return req.id if index == 0 else f"{req.id}_{index}"


def reply_parts(req: ParsedRequest, text: str, index: int = 0) -> tuple[str | None, str | None, list[dict]]:
    """A whole reply of choice `index` -> (its thinking or None, the answer's text, its tool calls in the chat API's
    shape); the answer is None where the reply is only calls."""
    reasoning, text = split_reasoning(text, req.thinking) if req.thinking is not None else (None, text)
    content, calls = split_tool_calls(text, req.tools) if req.tools else (text, [])
    return reasoning, content, message_tool_calls(_call_ids(req, index), calls, req.one_tool_call) if calls else []


def _choice(req: ParsedRequest, index: int, choice: Choice) -> dict:
    if req.kind == "completion":
        return {"index": index, "text": choice.text, "finish_reason": finish_reason(choice.stop_reason),
                "logprobs": choice.logprobs}
    reasoning, content, calls = reply_parts(req, choice.text, index)
    message = {"role": "assistant", "content": content, "refusal": None}
    if req.thinking is not None:
        message["reasoning_content"] = reasoning
        if reasoning is not None and not content and not calls:
            message["content"] = None              # cut off while thinking: no answer (as vLLM)
    if calls:
        message["tool_calls"] = calls
    return {"index": index, "message": message, "logprobs": choice.logprobs,
            "finish_reason": "tool_calls" if calls else finish_reason(choice.stop_reason)}


def response(req: ParsedRequest, choices: list[Choice], completion_tokens: int, cached_tokens: int,
             spec: dict) -> dict:
    """completion_tokens: of every choice together."""
    obj = "chat.completion" if req.kind == "chat" else "text_completion"
    return {"id": _prefix(req), "object": obj, "created": req.created, "model": req.model,
            "choices": [_choice(req, i, choice) for i, choice in enumerate(choices)],
            "usage": usage(len(req.prompt_ids), completion_tokens, cached_tokens), "speculation": spec}


def chunk(req: ParsedRequest, text: str | None, finish: str | None = None, first: bool = False,
          logprobs: dict | None = None, calls: list[ToolCall] | None = None, reasoning: str | None = None,
          index: int = 0) -> dict:
    """A streamed chunk of choice `index` carrying text and its tokens' logprobs block, or thinking
    (reasoning_content), or tool calls (whole, each with its index), or, with finish, the finish reason."""
    if req.kind == "chat":
        delta = {} if finish else {"content": text}
        if reasoning:
            delta = {"reasoning_content": reasoning}
        if calls:
            shaped = message_tool_calls(_call_ids(req, index), calls, req.one_tool_call)
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(shaped)]}
        if first:                                          # content null while a tool call may yet come, as OpenAI
            delta = {"role": "assistant", "content": None if req.tools else text or ""}
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        obj = "text_completion"
    out = {"id": _prefix(req), "object": obj, "created": req.created, "model": req.model, "choices": [choice]}
    if req.include_usage:
        out["usage"] = None
    return out


def usage_chunk(req: ParsedRequest, completion_tokens: int, cached_tokens: int) -> dict:
    return {"id": _prefix(req), "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
            "created": req.created, "model": req.model, "choices": [],
            "usage": usage(len(req.prompt_ids), completion_tokens, cached_tokens)}
