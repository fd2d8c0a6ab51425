"""Continuous batching: sequences join and leave between steps; one thread at a time runs the models.

Each iteration: retire finished and cancelled sequences (freeing their slots), admit waiting ones into free
slots, prefill ONE chunk of the oldest joining sequence (so no running sequence stalls longer than one chunk),
then one speculative step for every decoding sequence (batch_step.py). Active sequences always occupy slots
0 .. n - 1: when one leaves, those above it move down (each one's K/V copied once, up to its committed length),
so every call binds one contiguous range of the buffers and never copies KV per step.

Prompt cache (prompt_cache.py): free slots keep the K/V of the sequences that left them; a joining sequence whose
prompt starts with such a text takes that prefix instead of prefilling it.

Who runs the iterations: by default the callers themselves. A caller waiting for its sequence's next tokens
runs one iteration for every sequence if no other thread is running one (`pump`), else waits until that one
is done. A lone caller thus drives its own request with no thread hand-off per step (on a 2-core CPU a
hand-off to a waiting thread cost ~3 ms a step while onnxruntime's threads spin), and concurrent callers
take turns driving one shared batch. With `background=True` a worker thread drives instead (a server).
Callers only touch `submit` (a bounded queue: QueueFull when full), `pump`, and a sequence's `cancelled`
event and outbox.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

from specedge.errors import SpecedgeError
from specedge.runtime.batch_step import (Models, StepRecord, draft_ready, lacks_text, shaped, speculative_step,
                                         timed)
from specedge.runtime.logprobs import token_logprobs
from specedge.runtime.prompt_cache import PromptCache
from specedge.runtime.sequences import GenerationResult, Sequence
from specedge.runtime.verify import judge

PREFILL_CHUNK = 64
EVENTS_KEPT = 4096


class QueueFull(SpecedgeError):
    """Every slot is busy and the waiting queue is full (the server answers 429)."""


class Scheduler:
    def __init__(self, models: Models, max_batch: int, max_queue: int, decode, prompt_cache: bool = True):
        self.m, self.max_batch, self.max_queue, self.decode_ids = models, max_batch, max_queue, decode
        self.cache = PromptCache(models, max_batch, prompt_cache)   # what free slots hold (prompt_cache.py)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []                     # running[i].slot == i
        self.wake = threading.Condition(threading.RLock())      # submissions, and "an iteration finished"
        self.drive = threading.Lock()                           # held by the thread running an iteration
        self.background = False
        self.events: deque[StepRecord] = deque(maxlen=EVENTS_KEPT)
        self.counters = Counter()       # target_calls, draft_calls, steps, prefill_chunks, cached_prompt_tokens
        self.on_step = None             # callback(record) after each decode step, on the driving thread (server metrics)
        self.shared_policies: dict = {}  # the engine's shared policies (the generator's), told when the load is nothing
        self._inside = threading.local()   # .step: this thread is running an iteration (on_token runs there)

    # -- callers' side --------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        if self.in_step():
            # the driving thread holds `drive` (or is the worker): a request made here would wait on itself
            raise SpecedgeError("generate/stream cannot be called from an on_token callback (it runs inside a step)")
        with self.wake:
            if self.live() >= self.max_batch + self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_batch} running, {self.max_queue} waiting); retry later")
            self.waiting.append(seq)
            self.wake.notify()

    def in_step(self) -> bool:
        """Whether this thread is running an iteration (an on_token callback runs inside one)."""
        return getattr(self._inside, "step", False)

    def live(self) -> int:
        """Sequences running or waiting. Cancelled ones no longer count: in caller-driven mode nobody retires them
        until a caller drives, and dropped streams would otherwise fill the queue for good."""
        with self.wake:
            return sum(1 for s in (*self.running, *self.waiting) if not s.cancelled.is_set())

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def pump(self, seq: Sequence) -> None:
        """Progress for a caller whose sequence has nothing to read: one iteration if nobody else is running one,
        else a wait until the running one is done (then the caller looks again)."""
        if self.drive.acquire(blocking=False):
            try:
                if seq.outbox.empty():
                    self.iterate()
            finally:
                self.drive.release()
                with self.wake:
                    self.wake.notify_all()
            return
        with self.wake:
            if seq.outbox.empty() and self.drive.locked():
                self.wake.wait(timeout=1.0)

    # -- the worker's side ----------------------------------------------------------------------
    def iterate(self) -> None:
        """One iteration. Whatever fails outside a model call (a slot move, a bug) ends the running sequences with
        the error instead of leaving them to wait forever on a dead worker; waiting ones go on."""
        self._inside.step = True
        try:
            self._iterate()
        except Exception as err:  # noqa: BLE001 - reported to every running sequence's caller
            self._fail(self.running, err)
            self.running = []
            self._idle()
        finally:
            self._inside.step = False

    def _iterate(self) -> None:
        self._retire()
        self._admit()
        joining = [s for s in self.running if s.prefilled < len(s.prompt_ids)]
        if joining:
            self._guard(joining[:1], self._prefill_chunk, joining[0])
        decoding = [s for s in self.running if s.prefilled == len(s.prompt_ids) and not s.done]
        if decoding:
            self._guard(decoding, self._decode_step, decoding)
        self._retire()

    def _guard(self, seqs: list[Sequence], fn, *args) -> None:
        """A failing call ends the sequences it carried with the error; the others and the worker go on. An
        interruption (Ctrl+C on the driving thread) rewinds the rows it left half-stepped, then propagates."""
        before = [(s, s.prefilled, s.tgt_pos, s.dft_pos, len(s.tokens), s.rng.bit_generator.state,
                   s.constraint.depth if s.constraint is not None else 0,
                   len(s.prompt_logprobs) if s.prompt_logprobs is not None else 0) for s in seqs]
        try:
            fn(*args)
        except Exception as err:  # noqa: BLE001 - whatever a backend raises is reported to its callers
            self._fail(seqs, err)
        except BaseException:
            for s, prefilled, tgt_pos, dft_pos, n_tokens, rng_state, depth, scored in before:
                if len(s.tokens) == n_tokens:        # not committed yet: K/V past these positions is scratch
                    s.prefilled, s.tgt_pos, s.dft_pos = prefilled, tgt_pos, dft_pos
                    s.rng.bit_generator.state = rng_state
                    if s.constraint is not None:     # drafts or tokens it consumed for a commit that did not come
                        s.constraint.rewind(depth)
                    if s.prompt_logprobs is not None:    # a prefill chunk's scores: it is fed again
                        del s.prompt_logprobs[scored:]
            raise

    @staticmethod
    def _fail(seqs: list[Sequence], err: Exception) -> None:
        for s in seqs:
            if not s.done:
                s.done = True
                s.outbox.put(("error", err if isinstance(err, SpecedgeError) else
                              SpecedgeError(f"generation failed: {type(err).__name__}: {err}")))

    def _admit(self) -> None:
        admitted = []
        with self.wake:
            for seq in [s for s in self.waiting if s.cancelled.is_set()]:     # cancelled before they ran
                self.waiting.remove(seq)
                self._finish(seq, "cancelled")
            while self.waiting and len(self.running) < self.max_batch:
                if self._waits_for_a_prefill(self.waiting[0]):      # first come, first served: the rest wait too
                    break
                seq = self.waiting.popleft()
                seq.slot = len(self.running)
                self.running.append(seq)
                admitted.append(seq)
        try:
            self.cache.start(admitted, free_from=len(self.running), running=self.running)   # may permute their slots
        finally:                                                       # (even if interrupted part-way)
            if len(admitted) > 1:
                with self.wake:
                    self.running.sort(key=lambda s: s.slot)            # running[i].slot == i again
        self.counters["cached_prompt_tokens"] += sum(s.stats.cached_prompt_tokens for s in admitted)

    def _waits_for_a_prefill(self, seq: Sequence) -> bool:
        """Whether seq starts with the first prompt chunk of a running sequence still being prefilled (n choices of one
        request, clients sharing a system prompt): it waits for that prefill, then the prompt cache copies it in
        instead of prefilling it again. Prefills run one chunk an iteration, oldest first, so the wait costs it (and
        the requests behind it) nothing."""
        if not self.cache.enabled or seq.prompt_logprobs is not None or len(seq.prompt_ids) <= PREFILL_CHUNK:
            return False
        start = seq.prompt_ids[:PREFILL_CHUNK]
        return any(r.prefilled < len(r.prompt_ids) and not r.done and not r.cancelled.is_set()
                   and r.prompt_ids[:PREFILL_CHUNK] == start for r in self.running)

    def clear_prompt_cache(self) -> None:
        """Forgets what free slots hold (the next requests prefill their whole prompts)."""
        if self.in_step():
            raise SpecedgeError("clear_prompt_cache cannot be called from an on_token callback (it runs inside a "
                                "step)")
        with self.drive:
            self.cache.clear()

    def _idle(self) -> None:
        """Nothing runs: if nothing live waits either, every shared policy hears that the load fell to nothing (what
        comes next grows from there), those of the sequences that just ended and any other the engine holds."""
        if not any(not s.cancelled.is_set() for s in self.waiting):
            for policy in self.shared_policies.values():
                policy.observe_idle()

    def _retire(self) -> None:
        """Drops ended sequences and moves the others down into the holes (each kept sequence to its index). The
        list shrinks before anything is copied, so an interruption part-way neither records an ended sequence's
        text twice nor leaves a hole: the next call finishes the moves."""
        for seq in list(self.running):
            if seq.cancelled.is_set() and not seq.done:
                self._finish(seq, "cancelled")
        keep = [s for s in self.running if not s.done]
        if len(keep) == len(self.running) and all(s.slot == i for i, s in enumerate(keep)):
            return
        leaving = [s for s in self.running if s.done and s.stats.stop_reason]
        occupied = {s.slot for s in keep}
        spare = [j for j in range(len(keep), self.max_batch) if j not in occupied]
        self.running = keep
        if not keep:
            self._idle()
        self.cache.leave(leaving, spare, len(keep))
        for new_slot, seq in enumerate(keep):              # compaction: lowest first
            if seq.slot != new_slot:
                self.cache.move(seq, new_slot)
                seq.slot = new_slot
        self.cache.running(len(keep))

    def _prefill_chunk(self, s: Sequence) -> None:
        """The next chunk of s's prompt into both models (the draft only if it drafts with the model)."""
        chunk = s.prompt_ids[s.prefilled: s.prefilled + PREFILL_CHUNK]
        final = s.prefilled + len(chunk) == len(s.prompt_ids)
        t = time.perf_counter()
        scoring = s.prompt_logprobs is not None              # every row: each predicts the prompt token after it
        out = self.m.target.run([s.prefilled], [chunk], [len(chunk) if scoring else 1], lo=s.slot,
                                want="logits" if s.wants_logits or scoring else "ids")[0]
        if scoring:
            following = s.prompt_ids[s.prefilled + 1: s.prefilled + len(chunk) + 1]
            s.prompt_logprobs += token_logprobs(out[: len(following)], following, s.opts.prompt_logprobs)
        # the draft gets the prompt only if the policy would speculate in the batch this sequence joins and the
        # tokens it wants repay feeding the rest of the prompt: else it catches up once that pays
        # (batch_step.catch_up), and a useless draft, a batch too large for speculation to pay, or a long prompt
        # for a short answer costs nothing per request
        load = len(self.running)
        unfed = 1 + sum(1 for j in self.running if j is not s and j.policy is s.policy and lacks_text(j))
        if (s.uses_draft_model and self.m.draft is not None and s.dft_pos == s.prefilled
                and s.policy.speculates_at(load)
                and s.policy.catch_up_pays(len(s.prompt_ids) - s.prefilled, s.opts.max_new_tokens, load, unfed)):
            _, seconds = timed(self.m.draft.run, [s.prefilled], [chunk], [0], lo=s.slot, want="ids")
            s.policy.observe_catch_up(len(chunk), seconds)
            s.dft_pos = s.prefilled + len(chunk)
        self.counters["prefill_chunks"] += 1
        s.prefilled += len(chunk)
        s.tgt_pos = s.prefilled
        s.stats.prefill_s += time.perf_counter() - t
        if final:
            constrained = s.constraint is not None
            rows = shaped(s, out[-1:], [], [s.constraint.verify_mask()] if constrained else [])
            _, token, _ = judge(s.warp, s.rng, [], rows, None)
            if constrained:
                s.constraint.consume(token)
            self._commit(s, [token], token_logprobs(out[-1:], [token], s.opts.logprobs)
                         if s.opts.logprobs is not None else None)

    def _decode_step(self, rows: list[Sequence]) -> None:
        self._choose_k(rows)
        span = self.running[: max(s.slot for s in rows) + 1]
        record, committed = speculative_step(self.m, rows, span)
        predictions = [s.policy.expected_accepted(k) for s, k in zip(rows, record.k)]
        if all(p is not None for p in predictions):
            record.predicted = sum(predictions)
        self.counters["steps"] += 1
        self.counters["target_calls"] += 1
        self.counters["draft_calls"] += record.draft_calls
        policies = {id(s.policy): s.policy for s in rows if s.policy.shared}
        # catch-up is what turning speculation back on costs once, not a cost of each drafted token: counted in,
        # a probe after a long pause looked like a draft many times dearer, and kept speculation off
        draft_s = record.draft_s - record.catch_up_s
        for policy in policies.values():
            policy.observe_costs(max(record.k), draft_s, record.verify_s, record.verify_tokens,
                                 record.verify_rows, record.draft_rows)
            for tokens, seconds in record.catch_up_calls:
                policy.observe_catch_up(tokens, seconds)
        for s, k, n in zip(rows, record.k, record.accepted):
            if not s.policy.shared:
                s.policy.observe_costs(k, draft_s, record.verify_s, record.verify_tokens, len(rows))
            s.policy.observe_acceptance(k, n)
        self.events.append(record)
        if self.on_step is not None:
            self.on_step(record)
        for s in rows:                  # each its own: one caller's failing on_token ends that request only
            try:
                self._commit(s, *committed[id(s)])
            except Exception as err:  # noqa: BLE001 - a callback or decoder error, reported to that caller
                self._fail([s], err)

    def _choose_k(self, rows: list[Sequence]) -> None:
        """One k per shared policy for its rows (given the batch), each row's own policy otherwise; capped per row.
        A shared policy's probe (k = 1 while speculation is off) goes to the rows it asks for (`probing`: one, or
        two) in the lowest slots: a probe is for learning, and it should not cost every row a draft call and a
        catch-up."""
        caps = {id(s): s.k_cap(self.m.max_seq_len, self.m.max_draft) if s.drafter != "none" else 0 for s in rows}
        # the load is every admitted sequence, those still prefilling too: they join the decode steps within a few
        # chunks, and weighing k for the few rows already decoding turned speculation on (with a catch-up for each
        # row) at every ramp-up of a batch too large for it to pay
        load = max(len(rows), len(self.running))
        shared: dict[int, int] = {}
        for s in rows:
            if s.policy.shared:
                if id(s.policy) not in shared:
                    mine = [r for r in rows if r.policy is s.policy and caps[id(r)]]
                    unfed = sum(1 for j in self.running if j.policy is s.policy and lacks_text(j))
                    ready = {id(r) for r in mine if not r.uses_draft_model or draft_ready(r, load, unfed)}
                    # a sequence still prefilling drafts once it decodes if its draft is being fed the prompt
                    drafting = len(ready) + sum(1 for j in self.running if j.policy is s.policy
                                                and j.prefilled < len(j.prompt_ids)
                                                and (not j.uses_draft_model or j.dft_pos == j.prefilled))
                    # every decoding row drafts from a draft that holds its text: a ramp-up's k is theirs to weigh
                    fed = len(mine) == len(rows) and all(not r.uses_draft_model or len(r.tokens) - r.dft_pos <= 2
                                                         for r in mine)
                    shared[id(s.policy)] = s.policy.next_k(max(caps[id(r)] for r in mine), batch=load,
                                                           drafting=drafting, rows=len(rows),
                                                           rows_fed=fed) if mine else 0
                    if s.policy.probing:
                        # rows whose drafts hold their text first: a probe should not pay a catch-up if it can help it
                        probes = sorted(mine, key=lambda r: id(r) not in ready)[: s.policy.probing]   # stable: slots
                        shared[id(s.policy)] = (shared[id(s.policy)], probes)
                k = shared[id(s.policy)]
                if isinstance(k, tuple):
                    k = k[0] if any(s is r for r in k[1]) else 0
            else:
                k = s.policy.next_k(caps[id(s)]) if caps[id(s)] else 0
            s.k = min(k, caps[id(s)])

    def _commit(self, s: Sequence, new: list[int], logprobs: list | None = None) -> None:
        """Appends a step's tokens (and their logprobs, when asked for): cut at max_new_tokens, eos and the token
        that completes a stop string (so that the tokens do not depend on how many a step committed), decode, hand
        them to the caller."""
        new = new[: s.opts.max_new_tokens - s.n_new]
        hit = next((i for i, t in enumerate(new) if t in s.eos_ids), None)
        if hit is not None:
            new = new[: hit + 1]
        piece = ""
        for i, token in enumerate(new):                 # one at a time: a stop string ends the tokens where it ends
            piece += s.stops.push(s.decoder.push([token]))
            if s.stops.stopped:
                new = new[: i + 1]
                break
        if logprobs is not None:
            logprobs = logprobs[: len(new)]
            s.logprobs += logprobs
        s.tokens += new
        s.n_new += len(new)
        reason = None
        if s.stops.stopped:
            reason = "stop_string"
        elif hit is not None:
            reason = "eos"
        elif s.n_new >= s.opts.max_new_tokens:
            reason = "max_new_tokens"
        elif s.tgt_pos + 1 > self.m.max_seq_len:               # no slot for the pending token
            reason = "max_seq_len"
        if reason and reason != "stop_string":
            piece += s.stops.push(s.decoder.flush())
            piece += s.stops.flush()
        if s.on_token is not None:
            s.on_token(new, piece)
        s.outbox.put(("text", piece, new, logprobs))
        if reason:
            self._finish(s, reason)

    def _finish(self, s: Sequence, reason: str) -> None:
        s.done = True
        s.stats.stop_reason = reason
        s.stats.new_tokens = s.n_new
        s.stats.total_s = time.perf_counter() - s.started
        s.outbox.put(("done", GenerationResult(s.stops.text, s.generated, len(s.prompt_ids), s.stats,
                                               None if s.logprobs is None else list(s.logprobs),
                                               None if s.prompt_logprobs is None else list(s.prompt_logprobs))))
