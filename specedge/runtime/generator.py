"""The speculate -> verify -> accept loop over a bundle, with streaming and stats."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np
from tokenizers import Tokenizer

from specedge.errors import BundleError, OptionError, SpecedgeError
from specedge.runtime.chat import render_chat
from specedge.runtime.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specedge.runtime.manifest import read_manifest
from specedge.runtime.policies import make_policy
from specedge.runtime.row_check import choose_min_rows
from specedge.runtime.sampling import Warp, draw
from specedge.runtime.stats import GenerationStats
from specedge.runtime.step_model import StepModel
from specedge.runtime.text import IncrementalDecoder, StopStrings
from specedge.runtime.verify import accept_greedy, accept_sampled

PREFILL_CHUNK = 64
BACKENDS = ("cpu",)


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    k: int = 4                      # draft tokens per verify call; 0 = target alone
    use_draft: bool = True
    stop: tuple[str, ...] = ()
    chat: bool = False
    ignore_eos: bool = False        # run to max_new_tokens (benchmarks, tests)
    policy: str | None = None       # "fixed:K", "heuristic", "adaptive", "ngram", "hybrid", "target";
                                    # None: fixed k (or the target alone when k = 0 or use_draft is False)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]               # generated ids (an eos id that ended the run included)
    prompt_tokens: int
    stats: GenerationStats = field(default_factory=GenerationStats)

    def to_json(self, decode=None) -> dict:
        return {"text": self.text, "tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
                "stats": self.stats.to_json(decode)}


class Generator:
    """A loaded bundle: target (and draft) sessions, their KV buffers, and the tokenizer."""

    def __init__(self, bundle: str | Path, backend: str = "cpu", threads: int | None = None,
                 target_rows: str | int = "auto"):
        if backend not in BACKENDS:
            raise SpecedgeError(f"backend '{backend}' is not available (available: {', '.join(BACKENDS)})")
        self.path = Path(bundle)
        self.manifest = m = read_manifest(self.path)
        self.max_seq_len, self.max_draft, self.vocab_size = m["max_seq_len"], m["max_draft"], m["vocab_size"]
        self.eos_ids = set(m["eos_token_ids"])
        try:
            self.tokenizer = Tokenizer.from_file(str(self.path / m["tokenizer"]["file"]))
        except Exception as err:  # tokenizers raises a bare Exception on bad JSON
            raise BundleError(f"{self.path}: corrupt tokenizer ({str(err).splitlines()[0]})") from err
        template = m["tokenizer"].get("chat_template")
        self.chat_template = (self.path / template).read_text() if template else None
        max_step = max(PREFILL_CHUNK, self.max_draft + 2)
        models = m["models"]
        self.target = StepModel(self.path / models["target"]["file"], models["target"], self.max_seq_len,
                                self.vocab_size, max_step, threads)
        self.target_min_rows, self.target_steps_exact = self._set_target_rows(target_rows)
        self.draft, self.draft_head_ids = None, None
        if "draft" in models:
            entry = models["draft"]
            self.draft = StepModel(self.path / entry["file"], entry, self.max_seq_len,
                                   entry.get("logit_rows", self.vocab_size), max_step, threads)
            if "vocab_subset" in entry:
                self.draft_head_ids = self._head_ids(entry)
        self.last_result: GenerationResult | None = None
        self._policies: dict[str, tuple] = {}

    def _set_target_rows(self, target_rows: str | int) -> tuple[int, bool]:
        """Single target steps as 1 or 2 rows -> (rows, whether they equal verify rows here, bit for bit).
        "auto" measures and takes the fastest exact choice; 1 forces the one-row kernel (faster plain
        decoding, but on CPUs where it differs, greedy speculative output may differ from target-only
        output at near-ties); 2 forces padding."""
        if target_rows not in ("auto", 1, 2):
            raise OptionError(f"target_rows must be 'auto', 1 or 2, got {target_rows!r}")
        if target_rows == 2:                            # exact everywhere: nothing to probe
            if not self.target.pads_rows:
                raise OptionError("target_rows 2 needs a quantized target with a min_rows input; this one steps one row")
            self.target.min_rows = 2
            return 2, True
        exact_rows = choose_min_rows(self.target, self.vocab_size)
        if target_rows == "auto":
            return exact_rows, True
        self.target.min_rows = 1
        return 1, exact_rows == 1

    def _head_ids(self, entry: dict) -> np.ndarray:
        """The token id of each logit column of a draft with a lighter head [logit_rows]."""
        try:
            ids = np.asarray(json.loads((self.path / entry["vocab_subset"]["file"]).read_text()), np.int64)
        except (OSError, ValueError) as err:
            raise BundleError(f"{self.path}: corrupt draft vocabulary ({err})") from err
        if ids.shape != (entry["logit_rows"],) or ids.min() < 0 or ids.max() >= self.vocab_size:
            raise BundleError(f"{self.path}: draft vocabulary does not match its head ({entry['logit_rows']} rows)")
        return ids

    def _model_drafter(self) -> ModelDrafter:
        return ModelDrafter(self.draft, self.draft_head_ids, self.vocab_size)

    # -- public API ---------------------------------------------------------------------------
    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        if chat:
            if not self.chat_template:
                raise SpecedgeError("this bundle has no chat template; run without --chat")
            tok = self.manifest["tokenizer"]
            text = render_chat(self.chat_template, [{"role": "user", "content": prompt}],
                               tok.get("bos_token"), tok.get("eos_token"))
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(prompt).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def generate(self, prompt: str, **options) -> GenerationResult:
        for _ in self.stream(prompt, **options):
            pass
        return self.last_result

    def stream(self, prompt: str, **options) -> Iterator[str]:
        """Yields text pieces as tokens are accepted; `last_result` holds the full result afterwards."""
        opts = self._options(options)
        prompt_ids = self.encode(prompt, opts.chat)
        return self._stream_ids(prompt_ids, opts)

    def generate_ids(self, prompt_ids: list[int], **options) -> GenerationResult:
        for _ in self._stream_ids(list(prompt_ids), self._options(options)):
            pass
        return self.last_result

    # -- internals ----------------------------------------------------------------------------
    def _options(self, options: dict) -> GenerationOptions:
        opts = replace(GenerationOptions(), **options)
        opts = replace(opts, stop=tuple(opts.stop))
        if opts.max_new_tokens < 1:
            raise OptionError(f"max_new_tokens must be at least 1, got {opts.max_new_tokens}")
        if opts.temperature < 0:
            raise OptionError(f"temperature must be >= 0, got {opts.temperature}")
        if opts.top_k < 0:
            raise OptionError(f"top_k must be >= 0, got {opts.top_k}")
        if not 0.0 < opts.top_p <= 1.0:
            raise OptionError(f"top_p must be in (0, 1], got {opts.top_p}")
        if not 0 <= opts.k <= self.max_draft:
            raise OptionError(f"k must be between 0 and the bundle's max_draft {self.max_draft}, got {opts.k}")
        if opts.use_draft and opts.k > 0 and self.draft is None and opts.policy is None:
            raise OptionError("this bundle has no draft model; use --no-draft or k=0")
        if opts.policy is not None:
            make_policy(opts.policy, self.max_draft)          # validates the name
        return opts

    def _stream_ids(self, prompt_ids: list[int], opts: GenerationOptions) -> Iterator[str]:
        if not prompt_ids:
            raise SpecedgeError("the prompt is empty after tokenization")
        if len(prompt_ids) >= self.max_seq_len:
            raise SpecedgeError(f"the prompt has {len(prompt_ids)} tokens; the bundle's max_seq_len "
                                f"{self.max_seq_len} leaves no room to generate")
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        decoder, stops = IncrementalDecoder(self.tokenizer), StopStrings(list(opts.stop))
        generated: list[int] = []
        start = time.perf_counter()
        steps = self._decode(prompt_ids, opts, stats)
        try:
            for new in steps:
                generated += new
                piece = stops.push(decoder.push(new))
                if piece:
                    yield piece
                if stops.stopped:
                    stats.stop_reason = "stop_string"
                    break
            else:
                piece = stops.push(decoder.flush())
                piece += stops.flush()
                if piece:
                    yield piece
        finally:
            steps.close()
            stats.total_s = time.perf_counter() - start
            stats.new_tokens = len(generated)
            self.last_result = GenerationResult(stops.text, generated, len(prompt_ids), stats)

    def _pick(self, logits_row: np.ndarray, warp: Warp, rng: np.random.Generator) -> int:
        if warp.greedy:
            return int(logits_row.argmax())
        return draw(warp.probs(logits_row[None])[0], rng)

    def _strategy(self, opts: GenerationOptions):
        """-> (policy, drafter or None) for a request; policies persist per name so they keep learning."""
        spec = opts.policy or (f"fixed:{opts.k}" if opts.use_draft and opts.k > 0 else "target")
        if not opts.use_draft:
            spec = "target"
        if spec not in self._policies:
            self._policies[spec] = make_policy(spec, self.max_draft)
        policy, kind = self._policies[spec]
        if kind in ("model", "hybrid") and self.draft is None:
            raise OptionError(f"policy '{spec}' needs a draft model and this bundle has none; "
                              "use --no-draft or the ngram policy")
        drafter = {"none": lambda: None,
                   "model": lambda: self._model_drafter(),
                   "ngram": lambda: NgramDrafter(self.vocab_size),
                   "hybrid": lambda: HybridDrafter(NgramDrafter(self.vocab_size), self._model_drafter())}[kind]()
        return policy, drafter

    def reset_policies(self) -> None:
        """Forgets what the policies learned (acceptance and cost estimates, heuristic k)."""
        self._policies.clear()

    def policy(self, spec: str):
        """The live policy object behind a policy name (for inspection, e.g. the adaptive estimates)."""
        return self._policies[spec][0]

    def _decode(self, prompt_ids: list[int], opts: GenerationOptions, stats: GenerationStats) -> Iterator[list[int]]:
        """Yields the tokens committed by each step until eos, max_new_tokens or the end of the buffer."""
        tgt = self.target
        policy, drafter = self._strategy(opts)
        warp = Warp(opts.temperature, opts.top_k, opts.top_p)
        rng = np.random.default_rng(opts.seed)
        eos_ids = set() if opts.ignore_eos else self.eos_ids
        t0 = time.perf_counter()
        tgt.pos = 0
        token = self._pick(tgt.feed(prompt_ids, last=1)[-1], warp, rng)              # prefill (chunked)
        if drafter is not None:
            drafter.start(prompt_ids)
        stats.prefill_s = time.perf_counter() - t0
        tokens, n_new = prompt_ids + [token], 1
        yield [token]
        if token in eos_ids:
            stats.stop_reason = "eos"
            return
        while True:
            if n_new >= opts.max_new_tokens:
                stats.stop_reason = "max_new_tokens"
                return
            if tgt.pos + 1 > self.max_seq_len:                                # no slot for the pending token
                stats.stop_reason = "max_seq_len"
                return
            assert tgt.pos == len(tokens) - 1, (tgt.pos, len(tokens))
            room = self.max_seq_len - tgt.pos - 1                              # verify writes 1 + k slots
            k_max = min(self.max_draft, opts.max_new_tokens - n_new - 1, room)
            k = policy.next_k(k_max) if drafter is not None and k_max > 0 else 0
            new = self._step(tokens, k, drafter, policy, warp, rng, stats)
            new = new[: opts.max_new_tokens - n_new]
            hit = next((i for i, t in enumerate(new) if t in eos_ids), None)
            if hit is not None:
                new = new[: hit + 1]
            tokens += new
            n_new += len(new)
            yield new
            if hit is not None:
                stats.stop_reason = "eos"
                return

    def _step(self, tokens: list[int], k: int, drafter, policy, warp: Warp, rng: np.random.Generator,
              stats: GenerationStats) -> list[int]:
        """One decode step: up to k drafts, one target call, the accepted prefix + the target's token."""
        tgt = self.target
        # 1. draft: up to k proposals (a drafter may find fewer, an n-gram drafter none)
        t = time.perf_counter()
        drafts, q = drafter.propose(tokens, k, warp, rng, policy.keep_drafting if policy.early_stop else None) if k > 0 else ([], None)
        draft_s = time.perf_counter() - t
        if drafts and drafter.kind != "ngram":
            stats.n_draft_calls += len(drafts)
        # 2. verify: the target scores [pending token, d1..dk] in one call -> rows [k + 1, V]
        t = time.perf_counter()
        base = tgt.pos
        rows = tgt.feed(tokens[base:] + drafts, last=len(drafts) + 1)
        # 3. accept: the target decides every token
        if not drafts:
            n, token = 0, self._pick(rows[-1], warp, rng)
        elif warp.greedy:
            n, token = accept_greedy(drafts, rows)
        else:
            n, token = accept_sampled(drafts, q, warp.probs(rows), rng)
        verify_s = time.perf_counter() - t
        # 4. rewind: keep the K/V of accepted tokens only; stale slots are masked, overwritten later
        tgt.pos = base + 1 + n
        if drafter is not None:
            drafter.commit(tgt.pos)
        policy.observe(len(drafts), n, draft_s, verify_s, 1 + len(drafts))
        if drafts and drafter.confidences:
            policy.observe_confidences(drafter.confidences, n)
        stats.draft_s += draft_s
        stats.verify_s += verify_s
        stats.n_target_calls += 1
        stats.record_step(len(drafts), n, drafts, token)
        return drafts[:n] + [token]
