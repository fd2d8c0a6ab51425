"""Per-request state: everything a request owns lives here, nothing on a model, backend or generator.

A Sequence holds its KV slot (the same index in the target's and the draft's buffers), how many of its
tokens each model holds (tgt_pos, dft_pos: K/V at or beyond them is scratch), its tokens, options, RNG,
drafter and policy state, stats, its text decoder and the queue its caller reads.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import numpy as np

from specedge.runtime.logprobs import TokenLogprob
from specedge.runtime.sampling import Warp
from specedge.runtime.stats import GenerationStats
from specedge.runtime.text import IncrementalDecoder, StopStrings

DRAFTERS = ("model", "ngram", "hybrid", "none")


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    k: int = 4                      # draft tokens per verify call when no policy is named; 0 = target alone
    use_draft: bool = True          # False: the target alone
    policy: str | None = None       # how many to draft: "fixed:K", "heuristic", "adaptive", "adaptive:stop",
                                    # "target"; None: fixed k (the target alone when k = 0 or use_draft is False)
    drafter: str = "model"          # who drafts: "model", "ngram" (prompt lookup), "hybrid", "none"
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()  # token ids that end generation as an eos id does (kept, like it)
    chat: bool = False
    ignore_eos: bool = False        # run to max_new_tokens (benchmarks, tests)
    logprobs: int | None = None     # None: off; n >= 0: each generated token's logprob, the n likeliest at its place
    prompt_logprobs: int | None = None   # likewise for each prompt token after the first (scoring; no prompt cache)
    response_format: dict | None = None   # OpenAI's: {"type": "json_object"} or a json_schema (runtime/grammar.py)
    thinking: str | None = None     # under response_format: "opened" / "optional" <think> block before the grammar
    presence_penalty: float = 0.0   # OpenAI's, over generated tokens (runtime/penalties.py)
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # multiplicative, over prompt and generated tokens (1 = off)
    logit_bias: dict | None = None  # {token id: -100..100 added to its logit} (OpenAI's)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]               # generated ids (an eos id that ended the run included)
    prompt_tokens: int
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list[TokenLogprob] | None = None     # one per generated token, when asked for (options.logprobs)
    prompt_logprobs: list[TokenLogprob] | None = None   # one per prompt token after the first (prompt_logprobs)

    def to_json(self, decode=None) -> dict:
        out = {"text": self.text, "tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
               "stats": self.stats.to_json(decode)}
        if self.logprobs is not None:
            out["logprobs"] = [entry.to_json() for entry in self.logprobs]
        if self.prompt_logprobs is not None:
            out["prompt_logprobs"] = [entry.to_json() for entry in self.prompt_logprobs]
        return out


@dataclass(frozen=True)
class HeldText:
    """What a free slot's K/V still holds (the prompt cache): the target's for `tokens`, the draft's for the first
    `draft_len` of them. `finished`: a request's whole text (else a copy a moving sequence left behind, worth less);
    `stamp`: when it was last written or reused (the least recent goes first)."""
    tokens: np.ndarray              # [n] int64
    draft_len: int
    finished: bool
    stamp: int

    @classmethod
    def of(cls, seq: "Sequence", finished: bool, stamp: int) -> "HeldText | None":
        """What seq's slot holds (None: nothing yet)."""
        if not seq.tgt_pos:
            return None
        tokens = np.asarray(seq.tokens[: seq.tgt_pos], dtype=np.int64)     # fewer when a stop string cut a step
        return cls(tokens, min(seq.dft_pos, len(tokens)), finished, stamp)

    @property
    def worth(self) -> tuple[bool, int]:
        return self.finished, self.stamp

    def common_prefix(self, ids: list[int], limit: int) -> int:
        """How many of ids' first tokens (at most `limit`) this text starts with."""
        n = min(limit, len(self.tokens), len(ids))
        differ = np.flatnonzero(self.tokens[:n] != np.asarray(ids[:n], dtype=np.int64))
        return int(differ[0]) if differ.size else n


@dataclass
class Sequence:
    prompt_ids: list[int]
    opts: GenerationOptions
    warp: Warp
    rng: np.random.Generator
    policy: object                  # a Policy: the sequence's own, or one shared by the batch (adaptive)
    drafter: str                    # "model", "ngram", "hybrid" or "none"
    decoder: IncrementalDecoder
    stops: StopStrings
    eos_ids: frozenset
    on_token: object = None         # callback(ids, text) per commit, on the scheduler's thread
    slot: int = -1
    tokens: list[int] = field(default_factory=list)     # prompt + generated; the last one is pending
    tgt_pos: int = 0                # tokens whose K/V the target holds (committed)
    dft_pos: int = 0                # ... the draft holds
    prefilled: int = 0              # prompt tokens prefilled so far (both models)
    n_new: int = 0
    k: int = 0                      # this step's draft length
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list[TokenLogprob] | None = None         # per generated token, when opts.logprobs is set
    prompt_logprobs: list[TokenLogprob] | None = None  # per prompt token after the first, opts.prompt_logprobs
    constraint: object = None       # a grammar.Constraint when opts.response_format asks for structure
    penalties: object = None        # a penalties.Penalties when the options set any
    # ("text", piece, ids, logprobs of ids or None) ... then ("done", result) | ("error", exc)
    outbox: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    started: float = 0.0

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    @property
    def wants_logits(self) -> bool:
        """Whether the target must return logits for this row (sampling, logprobs, a grammar), not argmax ids."""
        return (not self.warp.greedy or self.opts.logprobs is not None or self.constraint is not None
                or self.penalties is not None)

    @property
    def uses_draft_model(self) -> bool:
        return self.drafter in ("model", "hybrid")

    def k_cap(self, max_seq_len: int, max_draft: int) -> int:
        """The most drafts this sequence's next verify call may carry: room in the buffer (the call writes the
        pending token + k), tokens still wanted (the target adds one of its own)."""
        room = max_seq_len - self.tgt_pos - 1
        return max(0, min(max_draft, self.opts.max_new_tokens - self.n_new - 1, room))
