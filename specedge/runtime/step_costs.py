"""What a speculative step costs, measured: seconds per draft step over the rows in the call, and per verify
phase over the tokens per row at each batch size (the adaptive policy's cost side)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

# With one size seen, an unseen size s costs c0 * (1 + g * (s - s0) / s0). g = 0.1 per unit (a memory-bound
# step) made a draft call over 2 rows look 44 ms where it cost 65 ms on the AVX2 EPYC (int4 is compute-bound
# there) and kept k = 1 at B = 2 while target-only was faster; g = 0.5 errs the other way, and a probe or an
# exploration step measures a second size soon, after which the line through measured sizes decides.
SINGLE_POINT_GROWTH = 0.5


@dataclass
class CostCurve:
    """Seconds as a function of a size: an exponential average per size seen; an unseen size is read off the
    least-squares line through the seen ones (close to linear in tokens on a CPU), or with one size seen, a
    prior halfway between free and proportional (SINGLE_POINT_GROWTH).

    The average forgets by the steps gone by since a size was last measured, not by its own samples (`now`: the
    cost model's step clock): a size measured rarely (the plain step while speculation is on) keeps what it cost
    when last seen, and on a shared machine that can be a slow burst; one such plain-step estimate, 247 ms against
    a median of 204, kept k = 1 on for 50 steps at B = 8 where it lost 9%."""

    decay: float = 0.9
    seen: dict[int, float] = field(default_factory=dict)
    when: dict[int, int] = field(default_factory=dict)   # size -> the step it was last measured at
    _line: tuple | None = None                       # (mean size, mean seconds, slope), refitted after observe

    def observe(self, size: int, seconds: float, now: int = 0) -> None:
        """now: the step clock (left at 0, the average decays per sample)."""
        keep = self.decay ** max(1, now - self.when.get(size, now))
        self.seen[size] = ema(self.seen.get(size), seconds, keep)
        self.when[size] = now
        self._line = None

    def __call__(self, size: int) -> float | None:
        if size in self.seen:
            return self.seen[size]
        if not self.seen:
            return None
        if len(self.seen) == 1:
            (s0, c0), = self.seen.items()
            return max(c0 * (1 + SINGLE_POINT_GROWTH * (size - s0) / s0), 1e-9)
        if self._line is None:
            xs, ys = zip(*self.seen.items())
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            self._line = (mx, my, max(slope, 0.0))
        mx, my, slope = self._line
        return max(my + slope * (size - mx), 1e-9)


@dataclass
class FeedCost:
    """Seconds to feed a draft n tokens (a prompt chunk, or text it missed), fitted to the last `keep` calls
    measured: a fixed cost a call plus a cost a token, least squares with the fixed cost kept between 0 and the
    cheapest size's cost and the cost a token >= 0. With one size measured, proportional to it. Past the largest size
    measured, that size's cost in proportion: text is fed a chunk a call, so a long prompt costs its chunks' calls
    (prompt chunks are the usual largest size). Catch-ups of a token or two cost about a whole call each: an average
    a token over them priced a 40-token prompt at 13 ms a token, where one call fed it at about 4.

    Each size enters the fit as the lower median of its calls: one draft call of 5 tokens took 0.309 s in a bench
    warm-up where another took 0.034; fitted to the calls themselves, that one priced every prompt at 25-34 ms a
    token (about 4 is right), a prompt judged not worth feeding is not fed, and so nothing measured better: in
    `bench --batch` lone requests went about 490 steps without their drafts (1.07x target-only, fixed:4 1.20x).
    A slow call at a size fed once (a prompt) is still taken as it is."""

    keep: int = 64
    calls: deque = field(default_factory=deque)
    _fit: tuple | None = None                 # (fixed s, s a token, largest size seen), refitted after observe

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.calls.append((tokens, seconds))
            while len(self.calls) > self.keep:
                self.calls.popleft()
            self._fit = None

    def __call__(self, tokens: int) -> float | None:
        if not self.calls:
            return None
        if tokens <= 0:
            return 0.0
        fixed, per_token, largest = self._fit or self._refit()
        n = min(tokens, largest)
        return (fixed + per_token * n) * tokens / n

    def _refit(self) -> tuple:
        by_size: dict[int, list[float]] = {}
        for tokens, seconds in self.calls:
            by_size.setdefault(tokens, []).append(seconds)
        xs, ys = zip(*((tokens, statistics.median_low(seconds)) for tokens, seconds in by_size.items()))
        largest = max(xs)
        fixed = 0.0
        if len(set(xs)) > 1:
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs), 0.0)
            fixed = min(max(my - slope * mx, 0.0), min(ys))
        # the cost a token for that fixed cost (least squares through it): with one size, seconds over tokens
        per_token = max(sum(x * (y - fixed) for x, y in zip(xs, ys)) / sum(x * x for x in xs), 0.0)
        self._fit = (fixed, per_token, largest)
        return self._fit


@dataclass
class CostModel:
    """Seconds per draft step as a function of the rows in the call (B), and per verify phase as a function of
    the tokens per row (T) at each batch size B: B rows of one token and one row of B tokens do not cost the
    same (each row attends over its own buffer), so each B seen gets its own curve over T; an unseen B falls
    back to one curve over the call's total tokens B x T. Both are wall times of the loop's phases, host work
    included: a cost model that counted only time inside model calls chose k = 1 with a useless cheap draft."""

    draft: CostCurve = field(default_factory=CostCurve)
    by_batch: dict[int, CostCurve] = field(default_factory=dict)     # B -> seconds over T
    by_tokens: CostCurve = field(default_factory=CostCurve)          # seconds over B x T
    steps: int = 0                                                   # the clock the curves forget by

    def observe_draft(self, rows: int, seconds_per_step: float) -> None:
        """After observe_verify of the same step."""
        self.draft.observe(rows, seconds_per_step, self.steps)

    def observe_verify(self, tokens: int, seconds: float, batch: int = 1) -> None:
        """tokens: the call's total tokens B x T. One call a step: it advances the clock."""
        self.steps += 1
        self.by_batch.setdefault(batch, CostCurve()).observe(tokens // batch, seconds, self.steps)
        self.by_tokens.observe(tokens, seconds, self.steps)

    def age(self, batch: int, tokens_per_row: int) -> float:
        """Steps since a verify of this shape was last measured (inf: never)."""
        curve = self.by_batch.get(batch)
        when = curve.when.get(tokens_per_row) if curve is not None else None
        return math.inf if when is None else self.steps - when

    def measured(self, batch: int, tokens_per_row: int) -> bool:
        curve = self.by_batch.get(batch)
        return curve is not None and tokens_per_row in curve.seen

    def drafts_age(self, batch: int) -> float:
        """Steps since a verify of drafts (2 tokens a row or more) was last measured at this batch size (inf:
        never)."""
        widths = self.by_batch[batch].seen if batch in self.by_batch else ()
        return min((self.age(batch, t) for t in widths if t >= 2), default=math.inf)

    def widest(self, batch: int) -> int:
        """The most tokens per row measured in a verify of `batch` rows (0: none)."""
        curve = self.by_batch.get(batch)
        return max(curve.seen, default=0) if curve is not None else 0

    def verify(self, tokens: int, batch: int = 1) -> float | None:
        """Seconds of a verify phase of `tokens` in all (B x T) over `batch` rows."""
        curve = self.by_batch.get(batch)
        return curve(tokens // batch) if curve is not None else self.by_tokens(tokens)

    @property
    def draft_step_s(self) -> float | None:
        return self.draft(1)


def ema(old: float | None, new: float, decay: float) -> float:
    """An exponential average: `decay` of the old value kept (the first sample taken as it is)."""
    return new if old is None else decay * old + (1 - decay) * new
