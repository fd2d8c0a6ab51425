"""/tokenize and /detokenize, in vLLM's shapes: what a client counts before it sends (a prompt's tokens, a chat
rendered by the model's template), without generating. The ids are the ones /v1/completions and
/v1/chat/completions would feed for the same prompt or messages, so `count` is their usage's prompt_tokens.

    POST /tokenize    {"prompt": text or ids} or {"messages": [...], "tools": [...], "chat_template_kwargs": {...}}
                      (+ "return_token_strs": true) -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize  {"tokens": [ids]} -> {"prompt": text, special tokens kept (a rendered chat reads back whole)}
"""

from __future__ import annotations

from specedge.errors import OptionError
from specedge.runtime.options import token_ids
from specedge.serve.errors import APIError, invalid, unsupported
from specedge.serve.protocol import Limits, chat_ids, prompt_ids_of, served_model
from specedge.serve.tools import requested_tools

_TOKENIZE = {"model", "prompt", "messages", "tools", "tool_choice", "chat_template_kwargs", "return_token_strs"}


def _defaults(body: dict) -> dict:
    """vLLM's switches, taken at what the generating routes do (their defaults in vLLM too): a prompt gets the
    tokenizer's special tokens (a BOS), a rendered chat does not (its template wrote them)."""
    if "messages" in body:
        return {"add_special_tokens": False, "add_generation_prompt": True}
    return {"add_special_tokens": True} if "prompt" in body else {}


def _checked(body, known: set[str], limits: Limits, defaults=lambda body: {}) -> dict:
    """defaults(body): vLLM's switches this route takes at one value only (name -> that value)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    defaults = defaults(body)
    for name, value in body.items():
        if name in defaults and value is not defaults[name]:
            raise unsupported(name, value, " (the ids are those the generating routes feed)")
        if name not in known and name not in defaults:
            raise APIError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")
    model = body.get("model")                     # optional here, as in vLLM; checked when given
    if model is not None:
        if not isinstance(model, str):
            raise invalid("'model' must be a string", "model")
        served_model(model, limits)
    return body


def tokenize(body, gen, limits: Limits) -> dict:
    body = _checked(body, _TOKENIZE, limits, _defaults)
    if ("prompt" in body) == ("messages" in body):
        raise invalid("give either 'prompt' or 'messages'", "prompt")
    if "prompt" in body:
        if "tools" in body or "tool_choice" in body or "chat_template_kwargs" in body:
            raise invalid("'tools', 'tool_choice' and 'chat_template_kwargs' go with 'messages'", "prompt")
        ids = prompt_ids_of(body, gen)
    else:
        ids = chat_ids(body, gen, limits, requested_tools(body, gen))
    strs = body.get("return_token_strs")
    if strs not in (None, True, False):
        raise invalid(f"'return_token_strs' must be a boolean, got {strs!r}", "return_token_strs")
    return {"count": len(ids), "max_model_len": gen.max_seq_len, "tokens": ids,
            "token_strs": [gen.tokenizer.id_to_token(i) for i in ids] if strs else None}


def detokenize(body, gen, limits: Limits) -> dict:
    body = _checked(body, {"model", "tokens"}, limits)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise invalid("'tokens' must be a list of token ids", "tokens")
    try:
        ids = token_ids(tokens, gen.vocab_size)
    except OptionError as err:
        raise invalid(str(err).replace("prompt ids", "'tokens'"), "tokens") from None
    return {"prompt": gen.tokenizer.decode(ids, skip_special_tokens=False)}
