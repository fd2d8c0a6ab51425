"""A loaded bundle: the tokenizer, both models on a backend, and the scheduler that batches every request.

`generate` / `stream` may be called from several threads at once: each call becomes a sequence, and all
active sequences run as rows of one batch (scheduler.py), driven by the waiting callers themselves or, with
background=True, by a worker thread. Nothing per request lives here.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from specedge.errors import BundleError, NoDraftModel, OptionError, SpecedgeError
from specedge.limits import MAX_THREADS
from specedge.runtime.backends import choose_backend, open_backend
from specedge.runtime.backends.base import decode_width
from specedge.runtime.backends.cpu import spinning_mode
from specedge.runtime.batch_step import Models
from specedge.runtime.chat import render_chat
from specedge.runtime.grammar import GrammarTokens, grammar_of
from specedge.runtime.penalties import penalties_of
from specedge.runtime.fim import find_fim, fim_ids
from specedge.runtime.manifest import read_manifest
from specedge.runtime.options import (chat_messages, checked_text, generation_options, integer, template_kwargs,
                                      token_ids, tool_definitions)
from specedge.runtime.policies import make_policy
from specedge.runtime.reasoning import END as THINK_END, START as THINK_START, prompt_opens_thinking, template_thinks
from specedge.runtime.row_check import check_finite, choose_min_rows
from specedge.runtime.sampling import Warp
from specedge.runtime.scheduler import PREFILL_CHUNK, Scheduler
from specedge.runtime.sequences import GenerationOptions, GenerationResult, Sequence
from specedge.runtime.async_stream import AsyncStream
from specedge.runtime.stream import Stream
from specedge.runtime.text import IncrementalDecoder, StopStrings

DEFAULT_MAX_QUEUE = 64


class Generator:
    def __init__(self, bundle: str | Path, backend: str = "cpu", threads: int | None = None,
                 target_rows: str | int = "auto", max_batch: int = 1, max_queue: int = DEFAULT_MAX_QUEUE,
                 background: bool = False, spinning: bool | str | None = None, device_id: int = 0,
                 cuda_graphs: bool = True, backend_options: dict | None = None, prompt_cache: bool | None = None):
        if not isinstance(bundle, (str, os.PathLike)):
            raise OptionError(f"bundle must be a folder path, got {bundle!r}")
        max_batch, max_queue = integer("max_batch", max_batch, 1), integer("max_queue", max_queue, 0)
        if threads is not None:
            threads = integer("threads", threads, 1, MAX_THREADS)
        if target_rows not in ("auto", 1, 2):
            raise OptionError(f"target_rows must be 'auto', 1 or 2, got {target_rows!r}")
        self.path = Path(bundle)
        self.threads = threads                              # intra-op threads per model (None: every core)
        self.manifest = m = read_manifest(self.path)
        self.backend_choice = None                          # what `auto` picked, and why
        if backend == "auto":
            backend, self.backend_choice = choose_backend(m)
        self.backend_name, self.max_batch = backend, max_batch
        self.max_seq_len, self.max_draft, self.vocab_size = m["max_seq_len"], m["max_draft"], m["vocab_size"]
        self.eos_ids = frozenset(m["eos_token_ids"])
        self._grammar_tokens = None                # structured output's view of the vocabulary, built on first use
        self._think_tags = None                    # (<think>, </think>) added tokens of their own? read on first use
        try:
            self.tokenizer = Tokenizer.from_file(str(self.path / m["tokenizer"]["file"]))
        except Exception as err:  # tokenizers raises a bare Exception on bad JSON
            raise BundleError(f"{self.path}: corrupt tokenizer ({str(err).splitlines()[0]})") from err
        template = m["tokenizer"].get("chat_template")
        self.chat_template = (self.path / template).read_text() if template else None
        self.fim = find_fim(self.tokenizer)                 # fill-in-the-middle tokens, where the tokenizer has them
        max_step = max(PREFILL_CHUNK, self.max_draft + 2)
        models = m["models"]
        options, widths = dict(backend_options or {}), {"target": 0, "draft": 0}
        if backend == "cpu":        # two sessions taking turns fight over few cores while idle threads spin (cpu.py)
            options.setdefault("spinning", spinning_mode(spinning, pair="draft" in models))
        elif backend in ("cuda", "tensorrt"):
            options.update(device_id=device_id, cuda_graphs=cuda_graphs)
            # one shape for every decode call (exact by construction, one CUDA graph): see backends/cuda.py
            widths = {role: decode_width(self.max_draft, role) for role in ("target", "draft")}
        self.target = open_backend(backend, self.path / models["target"]["file"], models["target"], self.max_seq_len,
                                   max_batch=max_batch, threads=threads, max_step=max_step,
                                   **self._with_width(options, widths["target"]))
        self.target_min_rows, self.target_steps_exact = self._set_target_rows(target_rows)
        self.draft = None
        if "draft" in models:
            entry = models["draft"]
            self.draft = open_backend(backend, self.path / entry["file"], entry, self.max_seq_len,
                                      max_batch=max_batch, threads=threads, max_step=max_step,
                                      **self._with_width(options, widths["draft"]))
            choose_min_rows(self.draft, self.vocab_size, role="draft")   # exact rows too: seeded sampling in a batch
        self.models = Models(self.target, self.draft, self.vocab_size, self.max_seq_len,
                             self.max_draft)
        self.prompt_cache = self._prompt_cache(prompt_cache)
        self.scheduler = Scheduler(self.models, max_batch, max_queue, self.decode, prompt_cache=self.prompt_cache)
        self.scheduler.background = background
        self._shared_policies: dict[tuple[str, str], object] = {}
        self.scheduler.shared_policies = self._shared_policies
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    def _prompt_cache(self, asked: bool | None) -> bool:
        """The prompt cache is exact where a token's K/V does not depend on the call that computed it: on the cpu
        backend with single steps equal to multi-row calls (checked at load). None: on exactly there."""
        why = None
        if self.backend_name != "cpu":
            why = (f"not verified on the {self.backend_name} backend (decode calls run at one fixed shape, prefill "
                   "chunks at others)")
        elif not self.target_steps_exact:
            why = "target_rows=1 makes a lone token's row differ from multi-row calls on this CPU"
        if asked is None:
            return why is None
        if not isinstance(asked, bool):
            raise OptionError(f"prompt_cache must be True, False or None, got {asked!r}")
        if asked and why:
            raise OptionError(f"the prompt cache would not be exact here: {why}")
        return asked

    @staticmethod
    def _with_width(options: dict, width: int) -> dict:
        return {"width": width, **options} if width else options        # an explicit width (backend_options) wins

    def _set_target_rows(self, target_rows: str | int) -> tuple[int, bool]:
        """A lone target token as 1 or 2 rows -> (rows, whether that equals verify rows here, bit for bit).
        "auto" measures and takes the fastest exact choice; 1 forces the one-row kernel (faster plain
        decoding, but on CPUs where it differs, greedy speculative output may differ from target-only
        output at near-ties); 2 forces padding."""
        if target_rows == 2:                            # exact everywhere: no rows to probe
            self.target.min_rows = 2
            check_finite(self.target, self.vocab_size, "target")
            return 2, True
        exact_rows = choose_min_rows(self.target, self.vocab_size, role="target")
        if target_rows == "auto":
            return exact_rows, True
        self.target.min_rows = 1
        return 1, exact_rows == 1

    # -- public API ---------------------------------------------------------------------------
    @property
    def kv_slot_bytes(self) -> dict[str, int]:
        """KV buffer bytes of one slot (one concurrent sequence), per model."""
        sizes = {"target": self.target.kv_slot_bytes}
        if self.draft is not None:
            sizes["draft"] = self.draft.kv_slot_bytes
        return sizes

    @property
    def events(self):
        """The most recent step records (batch_step.StepRecord), oldest first."""
        return list(self.scheduler.events)

    @property
    def counters(self) -> dict:
        """Calls made since load: steps, target_calls (after prefill), draft_calls, prefill_chunks; and
        cached_prompt_tokens (prompt tokens the prompt cache held)."""
        return dict(self.scheduler.counters)

    def encode(self, prompt: str, chat: bool = False, suffix: str | None = None) -> list[int]:
        """Prompt text -> ids: as it is, in the chat template (chat), or as fill-in-the-middle with the text that
        follows the gap (suffix: the model writes what goes between prompt and suffix)."""
        prompt = checked_text(prompt)
        if suffix is not None and suffix != "":             # an empty suffix is no suffix (as the server reads it)
            if chat:
                raise OptionError("suffix (fill-in-the-middle) and chat do not go together")
            if self.fim is None:
                raise OptionError("this bundle's tokenizer has no fill-in-the-middle tokens (suffix needs a code model "
                                  "trained for it, such as Qwen2.5-Coder or StarCoder)")
            return fim_ids(self.tokenizer, self.fim, prompt, checked_text(suffix, "the suffix"))
        if chat:
            if not self.chat_template:
                raise SpecedgeError("this bundle has no chat template, which a chat prompt (--chat, chat=True) needs")
            return self.encode_messages([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt).ids

    def encode_messages(self, messages: list[dict], chat_template_kwargs: dict | None = None,
                        tools: list[dict] | None = None) -> list[int]:
        """A conversation ([{"role": "system" | "user" | "assistant" | "tool", "content": str}, ...]) rendered by the
        bundle's chat template, ready for the assistant's next turn. chat_template_kwargs: further variables the
        template reads, e.g. {"enable_thinking": False} for Qwen3. tools: OpenAI-style tool definitions for the
        template to describe (`runtime.tool_calls.split_tool_calls` reads the calls back from the reply)."""
        if not self.chat_template:
            raise SpecedgeError("this bundle has no chat template (its source's tokenizer had none): "
                                "give it plain prompts")
        tok = self.manifest["tokenizer"]
        text = render_chat(self.chat_template, chat_messages(messages), tok.get("bos_token"), tok.get("eos_token"),
                           template_kwargs(chat_template_kwargs), tool_definitions(tools))
        checked_text(text, "the conversation (messages, tools and template variables)")  # a lone surrogate in any
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def stream(self, prompt: str, on_token=None, outbox=None, suffix: str | None = None, **options) -> Stream:
        """Starts a request; iterate the Stream for text pieces as tokens are committed, then read `.result`.
        on_token(ids, text) is called on the worker thread for every commit (keep it short).
        outbox: an object with put(event) that receives the request's events instead of the Stream (("text", piece,
        ids, logprobs of ids or None) ..., then ("done", result) or ("error", exc), put on the worker thread; a
        server's event-loop bridge); the Stream then only cancels.
        suffix: fill in the middle: the model writes what goes between prompt and suffix (code models)."""
        opts = self.options(**options)
        prompt_ids = self.encode(prompt, opts.chat, suffix)
        if opts.chat:
            opts = self.options(**self._thinking_first(prompt_ids, options))
        if suffix not in (None, ""):
            opts = replace(opts, stop_ids=self.fim_stop_ids(opts.stop_ids))
        return self._submit(prompt_ids, opts, on_token, outbox)

    def fim_stop_ids(self, stop_ids=()) -> tuple[int, ...]:
        """stop_ids for a fill-in-the-middle request: the middle also ends at the FIM family's markers."""
        return tuple(sorted(set(stop_ids) | self.fim.ends))

    def stream_ids(self, prompt_ids: list[int], on_token=None, outbox=None, **options) -> Stream:
        return self._submit(token_ids(prompt_ids, self.vocab_size), self.options(**options), on_token, outbox)

    def generate(self, prompt: str, **options) -> GenerationResult:
        return self.stream(prompt, **options).wait()

    def generate_ids(self, prompt_ids: list[int], **options) -> GenerationResult:
        return self.stream_ids(prompt_ids, **options).wait()

    def stream_chat(self, messages: list[dict], on_token=None, chat_template_kwargs: dict | None = None,
                    tools: list[dict] | None = None, outbox=None, **options) -> Stream:
        """The assistant's next turn in a conversation. Send the whole conversation each turn: the prompt cache (on
        by default where it is exact) prefills only what is new since the last turn."""
        ids = self.encode_messages(messages, chat_template_kwargs, tools)
        return self._submit(ids, self.options(**self._thinking_first(ids, options)), on_token, outbox)

    def chat(self, messages: list[dict], chat_template_kwargs: dict | None = None, tools: list[dict] | None = None,
             **options) -> GenerationResult:
        return self.stream_chat(messages, chat_template_kwargs=chat_template_kwargs, tools=tools, **options).wait()

    # -- asyncio: the same requests as AsyncStreams (async_stream.py) -------------------------------
    def astream(self, prompt: str, **options) -> AsyncStream:
        """stream() for asyncio code: `async for piece in gen.astream(...)`. The first async request starts the
        generator's worker thread (as load(..., background=True) does), which drives every request from then on:
        the event loop never runs a model call."""
        return AsyncStream(self._in_background(lambda outbox: self.stream(prompt, outbox=outbox, **options)))

    async def agenerate(self, prompt: str, **options) -> GenerationResult:
        return await self.astream(prompt, **options).wait()

    def astream_ids(self, prompt_ids: list[int], **options) -> AsyncStream:
        return AsyncStream(self._in_background(lambda outbox: self.stream_ids(prompt_ids, outbox=outbox, **options)))

    async def agenerate_ids(self, prompt_ids: list[int], **options) -> GenerationResult:
        return await self.astream_ids(prompt_ids, **options).wait()

    def astream_chat(self, messages: list[dict], **options) -> AsyncStream:
        return AsyncStream(self._in_background(lambda outbox: self.stream_chat(messages, outbox=outbox, **options)))

    async def achat(self, messages: list[dict], **options) -> GenerationResult:
        return await self.astream_chat(messages, **options).wait()

    def _in_background(self, submit):
        """submit, made to switch the generator to its worker thread first: flag and worker together, so that a
        submission that fails (a bad option, a full queue) leaves no synchronous caller waiting on a worker that
        never started."""
        def submitted(outbox):
            with self.scheduler.wake:
                self.scheduler.background = True
                self._ensure_worker()
            return submit(outbox)
        return submitted

    def clear_prompt_cache(self) -> None:
        """Forgets the text free slots hold, so that the next requests prefill their whole prompts (benchmarks)."""
        self.scheduler.clear_prompt_cache()

    def shared_policy(self, spec: str, drafter: str = "model"):
        """The live shared policy behind a name (e.g. 'adaptive': its acceptance and cost estimates)."""
        return self._shared_policies.get((spec, drafter))

    def reset_policies(self) -> None:
        """Forgets what the shared policies learned (acceptance and cost estimates)."""
        self._shared_policies.clear()

    def close(self) -> None:
        """Refuses new requests; a background worker stops once the running ones are done."""
        with self.scheduler.wake:               # as _submit checks it: a request is refused or runs, never lost
            self._closed = True
            self.scheduler.wake.notify_all()
        if self._worker is not None:
            self._worker.join()

    def options(self, **options) -> GenerationOptions:
        """Validated options (every bound explicit: a bad one is a one-line OptionError)."""
        opts = generation_options(options, self.max_draft)
        token_ids(opts.stop_ids, self.vocab_size)            # in the vocabulary
        token_ids(list(opts.logit_bias or ()), self.vocab_size)
        if self.draft is None and "k" not in options and opts.policy is None and opts.drafter == "model":
            opts = replace(opts, k=0)         # a target-only bundle runs the target alone unless asked to draft
        spec = self._policy_spec(opts)
        if spec != "target" and opts.drafter in ("model", "hybrid") and self.draft is None:
            raise NoDraftModel(opts.drafter)
        return opts

    # -- internals ----------------------------------------------------------------------------
    @staticmethod
    def _policy_spec(opts: GenerationOptions) -> str:
        if not opts.use_draft or opts.drafter == "none":
            return "target"
        return opts.policy or (f"fixed:{opts.k}" if opts.k > 0 else "target")

    def _submit(self, prompt_ids: list[int], opts: GenerationOptions, on_token, outbox=None) -> Stream:
        if on_token is not None and not callable(on_token):
            raise OptionError(f"on_token must be a function (ids, text), got {on_token!r}")
        if not prompt_ids:
            raise SpecedgeError("the prompt is empty after tokenization")
        if len(prompt_ids) >= self.max_seq_len:
            raise SpecedgeError(f"the prompt has {len(prompt_ids)} tokens; the bundle's max_seq_len "
                                f"{self.max_seq_len} leaves no room to generate")
        spec = self._policy_spec(opts)
        drafter = "none" if spec == "target" else opts.drafter
        policy = make_policy(spec, self.max_draft)
        if policy.shared:
            policy = self._shared_policies.setdefault((spec, drafter), policy)
        constraint = self._constraint(opts)     # before the clock starts: a first grammar builds the vocabulary's view
        seq = Sequence(prompt_ids=prompt_ids, opts=opts, warp=Warp(opts.temperature, opts.top_k, opts.top_p),
                       rng=np.random.default_rng(opts.seed), policy=policy, drafter=drafter,
                       decoder=IncrementalDecoder(self.tokenizer, prompt_ids), stops=StopStrings(list(opts.stop)),
                       eos_ids=frozenset() if opts.ignore_eos else self.eos_ids | set(opts.stop_ids),
                       on_token=on_token,
                       tokens=list(prompt_ids), started=time.perf_counter(),
                       logprobs=None if opts.logprobs is None else [], constraint=constraint,
                       prompt_logprobs=None if opts.prompt_logprobs is None else [],
                       penalties=penalties_of(opts),
                       **({} if outbox is None else {"outbox": outbox}))
        seq.stats.prompt_tokens = len(prompt_ids)
        with self.scheduler.wake:               # the worker decides to exit under this lock, seeing the queue empty
            if self._closed:
                raise SpecedgeError("this generator is closed")
            self.scheduler.submit(seq)
            if self.scheduler.background:
                self._ensure_worker()
        return Stream(seq, self.scheduler)

    def _constraint(self, opts: GenerationOptions):
        """The grammar state a response_format asks for (None: plain text); its text ends at an eos id or a stop id
        where the grammar is complete."""
        grammar = grammar_of(opts.response_format, opts.thinking, self._think_tokens())
        if grammar is None:
            return None
        if opts.ignore_eos:
            raise OptionError("ignore_eos cannot be combined with response_format (the grammar's text ends at an eos)")
        return self.grammar_tokens().constraint(grammar, self.eos_ids | set(opts.stop_ids))

    def _think_tokens(self) -> tuple[bool, bool]:
        """Whether the tokenizer holds <think>, </think> as added tokens of their own (Qwen3), each; read once."""
        if self._think_tags is None:
            added = {token.content for token in self.tokenizer.get_added_tokens_decoder().values()}
            self._think_tags = (THINK_START in added, THINK_END in added)
        return self._think_tags

    def _thinking_first(self, prompt_ids: list[int], options: dict) -> dict:
        """A chat request held to a response_format on a thinking template (one that knows </think>): the reply thinks
        first and the grammar holds after its </think>, as the server does; an explicit `thinking` option wins."""
        if options.get("response_format") is None or "thinking" in options or not template_thinks(self.chat_template):
            return options
        opened = prompt_opens_thinking(self.decode(prompt_ids[-16:]))
        return {**options, "thinking": "opened" if opened else "optional"}

    def grammar_tokens(self) -> GrammarTokens:
        """The vocabulary as the grammar library sees it, built on first use (about a second for a 150k vocabulary;
        the server builds it at start where llguidance is installed)."""
        if self._grammar_tokens is None:
            self._grammar_tokens = GrammarTokens(self.tokenizer.to_str(), self.tokenizer.get_vocab_size(True),
                                                 self.vocab_size, self.eos_ids)
        return self._grammar_tokens

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="specedge-worker", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        sched = self.scheduler
        while True:
            with sched.wake:
                while sched.idle() and not self._closed:
                    sched.wake.wait()
                if sched.idle() and self._closed:
                    return
            with sched.drive:
                sched.iterate()
