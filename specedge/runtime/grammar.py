"""Structured output: decoding held to a grammar (any JSON object, a JSON schema) by llguidance, an optional
dependency (`pip install 'specedge[structured]'`).

Speculation stays exact under a grammar: a row's constraint masks every row the target judges (each with the mask
of the state after the drafts before it) and every row the draft chooses from, so the target decides among the
allowed tokens exactly as it would alone (greedy: the masked argmax; sampled: the masked, renormalised
distribution, the lossless rule applied to the masked draft and target alike). Drafts are consumed tentatively and
rolled back after verification: the constraint's state is always that of the committed text.

    response_format={"type": "json_object"}
    response_format={"type": "json_schema", "json_schema": {"name": "...", "schema": {...}}}   # OpenAI's shape
"""

from __future__ import annotations

import functools
import json

import numpy as np

from specedge.errors import OptionError, SpecedgeError

class GrammarError(SpecedgeError):
    """The grammar's state no longer follows the text (a defect, not bad input)."""


INSTALL = "structured output needs llguidance: pip install 'specedge[structured]'"


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise OptionError(INSTALL) from None
    return llguidance


THINKING = ("opened", "optional")       # where a reasoning model's reply thinks before the grammar holds


def grammar_of(response_format, thinking: str | None = None, think_tokens: tuple[bool, bool] = (False, False)
               ) -> str | None:
    """OpenAI's response_format -> an llguidance grammar (None: plain text). A wrong shape or schema is an
    OptionError naming it.
    thinking: None, the grammar holds from the reply's first token; "opened", the prompt opened a <think> block and
    the grammar holds after its </think>; "optional", the reply may open one itself first (as vLLM applies a
    grammar after a reasoning parser's end). think_tokens: whether the tokenizer holds <think>, </think> as added
    tokens of their own (Qwen3, DeepSeek-R1's distills); the grammar library sees every added token as a special
    token, so the grammar names such a tag as a token rather than matching its text."""
    schema = _schema(response_format)
    # the keys in the schema's own order: the grammar writes an object's properties in that order (OpenAI's too)
    return None if schema is None else _compiled(json.dumps(schema), thinking, tuple(think_tokens))


def _schema(response_format) -> dict | bool | None:
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise OptionError("response_format must be {'type': 'text' | 'json_object' | 'json_schema', ...}")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise OptionError("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
    else:
        raise OptionError(f"response_format type '{kind}' is not supported (text, json_object, json_schema)")
    return schema


def _after_thinking(schema: str, thinking: str, think_tokens: tuple[bool, bool]) -> str:
    """The Lark grammar (llguidance's dialect) of a reply that thinks, then writes the schema's JSON: any text up
    to </think> (a token, or matched lazily as text), a little whitespace (bounded: a model held to a grammar it did
    not choose may otherwise fill it), then the JSON."""
    start_token, end_token = think_tokens
    thought = "THOUGHT </think>" if end_token else "thought"
    if thinking == "optional":
        opening = "<think>" if start_token else '"<think>"'
        thought = f"({opening} {thought} SPACE)?"
    else:
        thought += " SPACE"
    rules = "THOUGHT: /(?s:.*)/\n" if end_token else "thought[lazy]: /(?s:.*)<\\/think>/\n"
    return f"start: {thought} answer\n{rules}SPACE: /[ \\t\\r\\n]{{0,4}}/\nanswer: %json {schema}\n"


@functools.lru_cache(maxsize=64)
def _compiled(schema: str, thinking: str | None = None, think_tokens: tuple[bool, bool] = (False, False)) -> str:
    """A JSON schema's grammar, compiled once (the server checks a request's, then its sequence uses it)."""
    llguidance = _llguidance()
    if thinking not in (None, *THINKING):
        raise OptionError(f"thinking must be one of {', '.join(THINKING)} (or None), got {thinking!r}")
    try:
        grammar = (llguidance.LLMatcher.grammar_from_json_schema(schema) if thinking is None else
                   llguidance.LLMatcher.grammar_from_lark(_after_thinking(schema, thinking, think_tokens)))
    except (ValueError, TypeError, RuntimeError) as err:
        raise OptionError(f"response_format: the JSON schema is not usable: {err}") from None
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem and not problem.startswith("WARNING"):
        raise OptionError(f"response_format: the JSON schema is not usable: {problem}")
    return grammar


class GrammarTokens:
    """The bundle's vocabulary as llguidance sees it (built once per generator, on first use: ~1 s)."""

    def __init__(self, tokenizer_json: str, tokenizer_size: int, vocab_size: int, eos_ids):
        llguidance = _llguidance()
        self.vocab_size = vocab_size
        try:
            self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=max(tokenizer_size, vocab_size),
                                                    eos_token=sorted(eos_ids))
        except (ValueError, TypeError, RuntimeError) as err:
            raise OptionError(f"structured output: llguidance cannot read this bundle's tokenizer: {err}") from None

    def constraint(self, grammar: str, eos_ids) -> Constraint:
        """A sequence's grammar state; eos_ids: the ids that end its text (the bundle's and the request's stop ids)."""
        try:
            matcher = _llguidance().LLMatcher(self.tokenizer, grammar)
        except (ValueError, TypeError, RuntimeError) as err:
            raise OptionError(f"response_format: {err}") from None
        constraint = Constraint(matcher, self.vocab_size, eos_ids)
        if matcher.is_error() or not constraint.allowed().any():
            raise OptionError(f"response_format: this vocabulary cannot write the grammar's text "
                              f"({matcher.get_error() or 'no token allowed at the start'})")
        return constraint


class Constraint:
    """One request's grammar state over its committed tokens, and the drafts consumed on top of them. An eos id
    ends the text where the grammar accepts it; it is kept here (the matcher consumes only its own first eos id,
    and a chat model ends a turn with another), so that it pops like any token."""

    def __init__(self, matcher, vocab_size: int, eos_ids):
        self.matcher, self.vocab_size, self.ended = matcher, vocab_size, False
        self.ends = sorted(i for i in eos_ids if i < vocab_size)
        self.depth = 0                  # tokens pushed and not popped (an interrupted step rewinds to its start)

    def allowed(self) -> np.ndarray:
        """[V] bool: the tokens the grammar allows next (none once an eos ended it)."""
        if self.ended:
            return np.zeros(self.vocab_size, dtype=bool)
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        allowed[self.ends] = self.matcher.is_accepting()
        return allowed

    def verify_mask(self) -> np.ndarray:
        """allowed() for a row the target judges; every token once an eos ended the text (a row after a drafted
        eos never commits, but its distribution must stay finite). A grammar that allows nothing before its end is an
        error, not a row of -inf."""
        if self.ended:
            return np.ones(self.vocab_size, dtype=bool)
        allowed = self.allowed()
        if not allowed.any():
            raise GrammarError(f"the grammar allows no next token ({self.matcher.get_error() or 'a dead end'})")
        return allowed

    def push(self, token: int) -> bool:
        """Consumes a token; False (and nothing consumed) where the grammar does not allow it."""
        if self.ended:
            return False
        if token in self.ends:
            if not self.matcher.is_accepting():
                return False
            self.ended = True
        elif not (self.matcher.validate_tokens([token]) == 1 and self.matcher.consume_token(token)):
            return False
        self.depth += 1
        return True

    def consume(self, token: int) -> None:
        """push() for a token the mask allowed (after the end, a row past the text's end: nothing): a refusal would
        mean the state no longer follows the text, an error rather than output the grammar does not hold."""
        if not self.push(token) and not self.ended:
            raise GrammarError(f"the grammar refused token {token}, which its own mask allowed")

    def pop(self, n: int) -> None:
        """Takes back the last n tokens pushed."""
        self.depth -= n
        if n and self.ended:
            self.ended, n = False, n - 1
        if n:
            self.matcher.rollback(n)

    def rewind(self, depth: int) -> None:
        """Back to when `depth` tokens were pushed (a step interrupted before it committed)."""
        self.pop(self.depth - depth)


def masked(logits: np.ndarray, allowed: list[np.ndarray]) -> np.ndarray:
    """logits [n, V] -> a copy with what each row's mask forbids at -inf."""
    out = np.array(logits, dtype=np.float32, copy=True)
    out[~np.stack(allowed)] = -np.inf
    return out
