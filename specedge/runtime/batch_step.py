"""One speculative step for every decoding row: draft calls shared by the rows, one verify call, accept per row.

Rows are sequences in slots 0 .. hi - 1 of both models' buffers; each call carries the whole slot range, and a
row with nothing to do in a call (it drafts fewer tokens, or is still being prefilled) rides along as a dummy
row written into its own scratch slots. Each row's result depends only on its own tokens: the graphs' rows are
independent of the batch and of the row count (tested), so a sequence's tokens in a batch equal its tokens alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from specedge.runtime.backends.base import ModelBackend
from specedge.runtime.drafters import lookup_for, one_hot
from specedge.runtime.grammar import masked
from specedge.runtime.logprobs import token_logprobs
from specedge.runtime.sampling import draw
from specedge.runtime.sequences import Sequence
from specedge.runtime.verify import judge


@dataclass
class Models:
    target: ModelBackend
    draft: ModelBackend | None
    vocab_size: int
    max_seq_len: int
    max_draft: int


@dataclass
class StepRecord:
    """What one step did, for the policies, bench and the server: one per decode step."""
    batch: int
    k: list[int]                    # drafts per row
    accepted: list[int]             # accepted drafts per row
    rejections: list[dict] = field(default_factory=list)   # at each row's first rejection
    draft_calls: int = 0
    draft_rows: int = 0             # rows in the widest draft call (live rows and the dummies before them)
    draft_s: float = 0.0            # wall time of the draft phase (calls + host work), catch-up included
    catch_up_s: float = 0.0         # ... of which feeding drafts that fell behind (not a cost of drafting k)
    catch_up_tokens: int = 0        # ... and how many tokens that fed
    catch_up_calls: list = field(default_factory=list)   # (tokens, seconds) of each feeding call
    verify_s: float = 0.0           # wall time of the verify phase (call + acceptance + commit bookkeeping)
    model_s: float = 0.0            # time inside backend calls
    verify_tokens: int = 0          # B x T of the verify call
    verify_rows: int = 0            # its B (decoding rows and any dummy rows before the last of them)
    predicted: float | None = None  # expected accepted drafts, as the policy predicted them


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def lacks_text(s: Sequence) -> bool:
    """Whether s's draft model lacks s's text beyond what a draft call takes along: a decoding row more than two
    tokens behind, or a row still prefilling whose prompt is not being fed to its draft (or not yet begun: whether
    to feed it is still to be decided, and it would have to be fed for every row to draft)."""
    if not s.uses_draft_model:
        return False
    if s.prefilled < len(s.prompt_ids):
        return s.dft_pos != s.prefilled or s.prefilled == 0
    return len(s.tokens) - s.dft_pos > 2


def draft_ready(s: Sequence, batch: int | None = None, unfed: int = 1) -> bool:
    """Whether s's draft model holds s's text (at most the pending tokens missing), or feeding it what it lacks
    pays for the tokens s still wants (Policy.catch_up_pays, at this batch size, None: as the policy last
    weighed, with `unfed` rows lacking their text): catching up costs about a prefill of what it lacks, which a
    few speculative steps at the end of a request may not repay."""
    behind = len(s.tokens) - s.dft_pos
    return behind <= 2 or s.policy.catch_up_pays(behind, s.opts.max_new_tokens - s.n_new, batch, unfed)


def catch_up(m: Models, s: Sequence) -> float:
    """A draft more than two tokens behind (skipped steps, or a prompt it was not fed while speculation was off)
    is fed alone, all but the last missing token, so that the shared draft calls stay short (T <= 2) and within
    every row's headroom; one chunk a call, and with other rows in the step one chunk a step, so that no other
    row stalls longer than one chunk (a row still behind sits this step's drafting out). -> seconds in calls."""
    chunk = s.tokens[s.dft_pos:-1][: m.draft.max_step]
    if not chunk:
        return 0.0
    _, seconds = timed(m.draft.run, [s.dft_pos], [chunk], [0], lo=s.slot, want="ids")
    s.dft_pos += len(chunk)
    return seconds


def shaped(s: Sequence, rows: np.ndarray, drafts: list[int], masks: list, before: list[int] = ()) -> np.ndarray:
    """What a row decides on: the model's logits rows [n, V] (row j after s's text, `before`, and drafts[:j]),
    penalised for the text before each row, then masked by its grammar (masks: one allowed set per row)."""
    if s.penalties is not None:
        rows = s.penalties.apply(rows, s.prompt_ids, s.generated + list(before), drafts)
    return masked(rows, masks) if s.constraint is not None else rows


def allowed_lookup(s: Sequence, proposal: list[int], masks: list) -> list[int]:
    """A constrained row's looked-up drafts: the prefix the grammar allows, consumed, each position's mask kept."""
    kept = []
    for token in proposal:
        allowed = s.constraint.allowed()
        if not allowed[token]:
            break
        masks.append(allowed)
        s.constraint.consume(token)
        kept.append(token)
    return kept


def draft_phase(m: Models, rows: list[Sequence], span: list[Sequence], record: StepRecord):
    """-> per row (by id): drafts, q [n, V] or None (greedy), draft confidences (early stop), draft calls taken,
    the grammar masks of its draft positions (constrained rows; their drafts are left consumed, see verify).
    One draft call per draft position for all rows that still draft."""
    drafts = {id(s): lookup_for(s.drafter, s.tokens, s.k) if s.k else [] for s in rows}
    masks = {id(s): [] for s in rows if s.constraint is not None}
    for s in rows:
        if s.constraint is not None and drafts[id(s)]:
            drafts[id(s)] = allowed_lookup(s, drafts[id(s)], masks[id(s)])
    q_rows = {id(s): [] for s in rows}
    live = [s for s in rows if s.k and s.uses_draft_model and not drafts[id(s)]]
    unfed = sum(1 for s in live if lacks_text(s))
    live = [s for s in live if draft_ready(s, unfed=unfed)]   # a draft far behind catches up only where that pays
    alone = len(rows) == 1                     # no other row to stall: catch up all at once, and draft this step
    for s in live:
        # a seeded sampled row catches up all at once in a batch too: its draws must fall where they fall alone
        whole = alone or (s.opts.seed is not None and not s.warp.greedy)
        while len(s.tokens) - s.dft_pos > 2:
            before = s.dft_pos
            seconds = catch_up(m, s)
            record.model_s += seconds
            record.catch_up_s += seconds
            record.catch_up_tokens += s.dft_pos - before
            record.catch_up_calls.append((s.dft_pos - before, seconds))
            if not whole:
                break
    live = [s for s in live if len(s.tokens) - s.dft_pos <= 2]
    confidences = {id(s): [] for s in live}
    calls = {id(s): 0 for s in live}           # draft-model calls each row took part in
    step = 0
    while live:
        feed = {id(s): (s.tokens[s.dft_pos:] if step == 0 else drafts[id(s)][-1:]) for s in live}
        sampled = any(not s.warp.greedy for s in live)
        hi = max(s.slot for s in live) + 1
        starts = [seq.dft_pos for seq in span[:hi]]
        tokens = [feed.get(id(seq), []) for seq in span[:hi]]
        logits = sampled or any(s.policy.early_stop or s.constraint is not None or s.penalties is not None
                                for s in live)
        out, seconds = timed(m.draft.run, starts, tokens, [1 if t else 0 for t in tokens],
                              want="logits" if logits else "ids")
        record.model_s += seconds
        record.draft_calls += 1
        record.draft_rows = max(record.draft_rows, hi)
        still = []
        for s in live:
            s.dft_pos += len(feed[id(s)])
            calls[id(s)] += 1
            row = out[s.slot][-1]
            allowed = []
            if s.constraint is not None:
                allowed = [s.constraint.allowed()]
                if not allowed[0].any():               # the grammar has ended (after an eos): nothing to draft
                    continue
                masks[id(s)].append(allowed[0])
            if s.constraint is not None or s.penalties is not None:
                # the row after this row's drafts so far: penalised as if they were generated
                row = shaped(s, row[None], [], allowed, before=drafts[id(s)])[0]
            if row.dtype == np.int64:
                token, confidence = int(row), None
            elif s.warp.greedy:
                column = int(row.argmax())
                token = column
                confidence = float(1.0 / np.exp(row - row[column]).sum()) if s.policy.early_stop else None
            else:
                q = s.warp.probs(row[None])[0]
                column = draw(q, s.rng)
                token = column
                q_rows[id(s)].append(q)
                confidence = float(q[column])
            drafts[id(s)].append(token)
            if s.constraint is not None:
                s.constraint.consume(token)
            if s.policy.early_stop:
                confidences[id(s)].append(confidence)
            done = len(drafts[id(s)]) >= s.k or (s.policy.early_stop and not s.policy.keep_drafting(confidences[id(s)]))
            if not done:
                still.append(s)
        live, step = still, step + 1
    q = {}
    for s in rows:
        d = drafts[id(s)]
        if s.warp.greedy or not d:
            q[id(s)] = None
        else:
            q[id(s)] = np.stack(q_rows[id(s)]) if q_rows[id(s)] else one_hot(d, m.vocab_size)
    return drafts, q, confidences, calls, masks


def speculative_step(m: Models, rows: list[Sequence], span: list[Sequence]) -> tuple[StepRecord, dict]:
    """rows: the decoding sequences, each with its k set; span: the sequence in each slot 0 .. len - 1.
    -> (the step's record, {id(row): (committed tokens, their logprobs or None)}) with every row's positions
    advanced."""
    record = StepRecord(batch=len(rows), k=[], accepted=[])
    # 1. draft: lookups, then up to max k shared draft calls
    t0 = time.perf_counter()
    drafts, q, confidences, calls, masks = (draft_phase(m, rows, span, record) if any(s.k for s in rows)
                                            else ({}, {}, {}, {}, {}))
    t1 = time.perf_counter()
    record.draft_s = t1 - t0
    # 2. verify: one target call, row b = [pending token, its drafts] at its committed length
    hi = max(s.slot for s in rows) + 1
    by_slot = {s.slot: s for s in rows}
    starts = [seq.tgt_pos for seq in span[:hi]]
    tokens = [seq.tokens[seq.tgt_pos:] + drafts.get(id(seq), []) if seq.slot in by_slot else [] for seq in span[:hi]]
    last = [len(drafts.get(id(seq), [])) + 1 if seq.slot in by_slot else 0 for seq in span[:hi]]
    out, seconds = timed(m.target.run, starts, tokens, last,
                         want="logits" if any(s.wants_logits for s in rows) else "ids")
    record.model_s += seconds
    record.verify_rows, record.verify_tokens = hi, hi * max(len(t) for t in tokens)
    # 3. accept: the target decides every token; 4. rewind: positions only, stale slots are scratch
    committed, wanted = {}, []
    for s in rows:
        d, rows_out = drafts.get(id(s), []), out[s.slot]
        judged = rows_out
        if s.constraint is not None or s.penalties is not None:   # each row as after the drafts before it
            allowed = masks.get(id(s), []) + [s.constraint.verify_mask()] if s.constraint is not None else []
            judged = shaped(s, rows_out, d, allowed)
        n, token, p = judge(s.warp, s.rng, d, judged, q.get(id(s)))
        if s.constraint is not None:       # back to the committed text, then what this step commits
            s.constraint.pop(len(d))
            for t in d[:n] + [token]:
                s.constraint.consume(t)
        if n < len(d):
            rejection = {"slot": s.slot, "position": n + 1, "draft_token": d[n], "target_token": token}
            if p is not None:
                rejection.update(p_draft=float(p[n, d[n]]), q_draft=float(q[id(s)][n, d[n]]))
            record.rejections.append(rejection)
        s.tgt_pos += 1 + n
        s.dft_pos = min(s.dft_pos, s.tgt_pos)
        if d and s.policy.early_stop:
            s.policy.observe_confidences(confidences.get(id(s), []), n)
        s.stats.record_step(len(d), n, d, token)
        s.stats.n_target_calls += 1
        s.stats.n_draft_calls += calls.get(id(s), 0)
        record.k.append(len(d))
        record.accepted.append(n)
        committed[id(s)] = (d[:n] + [token], None)
        if s.opts.logprobs is not None:
            wanted.append((s, rows_out))
    record.verify_s = time.perf_counter() - t1
    for s, logits in wanted:        # after the timing, which the policies weigh (logits: the target's output, valid
        new = committed[id(s)][0]       # until its next call)
        committed[id(s)] = (new, token_logprobs(logits, new, s.opts.logprobs))
    for s in rows:
        s.stats.draft_s += record.draft_s
        s.stats.verify_s += record.verify_s
    return record, committed
