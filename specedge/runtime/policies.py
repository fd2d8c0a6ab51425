"""Speculation policies: how many tokens to draft before the next verify call (who drafts is the drafter's axis).

Feedback comes in two parts: after each step the costs it measured (`observe_costs`: wall time of the draft
phase and of the verify phase, host work included, the verify call's total token count B x T and the batch
size B), and for each row what it drafted and the target accepted (`observe_acceptance`). k = 0 means a plain
target step. A `shared` policy is one object for every row of a batch that names it, and learns across
requests (adaptive); the others belong to one sequence.
"""

from __future__ import annotations

import math

from specedge.errors import OptionError
from specedge.runtime.confidence import ConfidenceCalibration
from specedge.runtime.load_stretches import LoadStretches
from specedge.runtime.step_costs import CostModel, FeedCost


class Policy:
    early_stop = False                # True: ask keep_drafting before each further draft step
    shared = False
    off = False                       # True: speculation is switched off for now (adaptive), the draft is not fed
    name = "policy"

    def next_k(self, max_k: int, batch: int = 1, drafting: int | None = None, rows: int | None = None,
               rows_fed: bool = False) -> int:
        """batch: the load (admitted sequences); drafting: how many of them would draft (None: all), for a shared
        policy: a row whose draft lacks text that would not pay to feed rides along at k = 0; rows: how many decode
        in this step (None: batch; fewer while sequences still prefill); rows_fed: every one of them holds its text
        in its draft (drafting costs them no catch-up)."""
        raise NotImplementedError

    def observe_acceptance(self, k: int, n_accepted: int) -> None:
        pass

    def observe_costs(self, k: int, draft_s: float, verify_s: float, verify_tokens: int, batch: int = 1) -> None:
        pass

    def observe(self, k: int, n_accepted: int, draft_s: float, verify_s: float, verify_tokens: int) -> None:
        """One row alone: its costs and its acceptance."""
        self.observe_costs(k, draft_s, verify_s, verify_tokens, 1)
        self.observe_acceptance(k, n_accepted)

    def expected_accepted(self, k: int) -> float | None:
        """Expected accepted drafts of one row at k (None: this policy does not predict)."""
        return None

    def keep_drafting(self, confidences: list[float]) -> bool:
        """Asked before each further draft step, with the confidences of the drafts made so far."""
        return True

    def observe_confidences(self, confidences: list[float], n_accepted: int) -> None:
        pass

    def speculates_at(self, batch: int) -> bool:
        """Whether this policy would draft in a batch of this size now (a query, no side effects): a sequence
        joining such a batch feeds its prompt to the draft only then."""
        return not self.off

    def catch_up_pays(self, behind: int, remaining: int, batch: int | None = None, unfed: int = 1) -> bool:
        """Whether feeding a draft the `behind` tokens it lacks (a prompt, or text it missed) pays for a row with
        `remaining` tokens to go, in a batch of this size (None: the one weighed last), where `unfed` rows (this one
        included) lack their text in their drafts. A policy that does not weigh costs always feeds it: fixed:4
        drafts 4 whatever a prompt costs."""
        return True

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        pass

    def observe_idle(self) -> None:
        """The engine has no sequence left, running or waiting (every shared policy of the engine hears it)."""


class FixedPolicy(Policy):
    def __init__(self, k: int):
        self.k, self.name = k, f"fixed:{k}"

    def next_k(self, max_k: int, batch: int = 1, drafting: int | None = None, rows: int | None = None,
               rows_fed: bool = False) -> int:
        return min(self.k, max_k)


class HeuristicPolicy(Policy):
    """Hugging Face assisted generation: +2 after a step where every draft was accepted, -1 otherwise."""

    name = "heuristic"

    def __init__(self, start: int = 5, limit: int = 8):
        self.k, self.limit = start, limit

    def next_k(self, max_k: int, batch: int = 1, drafting: int | None = None, rows: int | None = None,
               rows_fed: bool = False) -> int:
        return min(self.k, max_k, self.limit)

    def observe_acceptance(self, k: int, n_accepted: int) -> None:
        if k == 0:
            return
        self.k = min(self.k + 2, self.limit) if n_accepted == k else max(1, self.k - 1)


# Where the best k beats the plain step by less than this, the plain step is measured again once its last
# measurement is `recheck_after` steps old: at B = 8 on the int4 pair k = 1 won on paper for 50 steps, against a
# plain-step estimate taken in a slow burst, and lost 9%. Where speculation wins clearly (2.7x alone) it never is.
RECHECK_MARGIN = 1.25


class AdaptivePolicy(Policy):
    """Picks k in [0, max_k] for the whole batch, maximising expected committed tokens per second:
    B * E(k) / (k * draft(B) + verify(B * (k + 1))), with k = 0 a plain target step.

    E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j, where a_j is the probability that draft position j is accepted
    given that positions before it were: a Beta estimate with a prior (so it starts sensibly) and forgetting
    (so it follows a change), shared by the rows. The costs are measured wall times as functions of the call's
    size (CostModel): at batch 1 on a memory-bound target extra verified tokens are nearly free; as B grows they
    are not, and k shrinks to 0; it comes back when the batch shrinks. A position never tried yet borrows the
    estimate of the last tried one, and every `explore_every` steps it tries one more (then one fewer) than the
    best k, so the costs of other verify sizes and the acceptance of deeper positions get measured; k goes at most
    one verify width past the widest measured at its batch size (`_measured_growth`). While k = 0
    wins it still probes with k = 1 after `probe_every` steps (`probing`: one row of the batch, two while the
    draft's cost is known at one row count only), to notice when the draft or the load changed. Each batch size
    keeps its own probe clock: a probe after which k = 0 still wins doubles the wait at that size (up to
    `max_probe_gap` times: with a useless draft the probes, and the draft catching up the text for them, were
    most of what it cost), and where even a draft accepted every time could not beat the plain step on the costs
    measured there (on a CPU verifying 2 tokens a row at B = 4 costs 1.7x one) it waits the longest at once:
    a probe teaches acceptance, and acceptance cannot change that verdict. At each batch size the plain step is
    measured before any k is weighed against it, and a probe there measures what verifying 2 tokens a row costs
    before every row speculates (extrapolated from the plain step alone it looked 1.5x and turned k = 2 on at
    B = 4, where it lost), and again where that was over `recheck_after` steps ago (the machine's speed drifts,
    and a fresh plain step weighed against an old verify compares two speeds; `_stale_drafts`). Off, it
    does not weigh the options again until the probe or a change of batch size (a plain step teaches it nothing):
    a tiny model's step is a fraction of a millisecond, and the weighing itself would show.
    The batch it weighs is the admitted load (the scheduler counts sequences still prefilling too), of which
    `drafting` rows can draft: a joining sequence feeds its prompt to the draft only where k > 0 would win
    (speculates_at) and the tokens it asks for repay the feeding (catch_up_pays, from the measured cost of feeding
    a draft, prompts and catch-ups alike: FeedCost), a draft that fell behind catches up only where the tokens
    left repay it, and a row that does not draft is weighed as committing one token a step while it pays for
    the longer verify call. While a batch ramps up (sequences still prefilling), a step whose decoding rows all hold
    their text in their drafts is weighed for those rows (`_ramp_k`), the load's own state left alone.
    The cost estimates forget by steps gone by (CostCurve), and where the best k beats the plain step by less than
    RECHECK_MARGIN, the plain step is measured again once its measurement is `recheck_after` steps old: while
    speculation is on nothing else measures it, and a narrow win taken against a slow burst would last.
    Near-ties between positive k go to the longer draft (acceptance comes in runs), but k > 0 must beat k = 0
    by more than the tie margin: the forgetting prior keeps a useless draft's acceptance estimate a little above
    zero, and with a cheap draft that alone would otherwise keep k = 1.

    Early stop: before each further draft step it weighs that step's expected gain, P(every draft so far
    is accepted, given their confidences) * a_next, against what the step costs at the current rate
    (tokens/s times draft step + one more verify token); acceptance per confidence is calibrated online.
    Off by default ('adaptive:stop' turns it on): on the real pair it stopped too early while the calibration
    was young.
    """

    name = "adaptive"
    shared = True

    def __init__(self, max_draft: int, prior_accept: float = 0.8, prior_weight: float = 1.0, forget: float = 0.97,
                 probe_every: int = 16, max_probe_gap: int = 16, explore_every: int = 4, warmup_k: int = 4, tie: float = 0.02,
                 early_stop: bool = False, costs: CostModel | None = None, recheck_after: int = 32):
        self.max_draft, self.forget, self.probe_every, self.warmup_k = max_draft, forget, probe_every, warmup_k
        self.explore_every, self.steps, self.explore_up = explore_every, 0, True
        self.tie, self.early_stop, self.rate = tie, early_stop, None
        self.recheck_after = recheck_after        # steps before a narrow win's plain-step estimate is measured again
        self.calibration = ConfidenceCalibration()
        self.observed = [0.0] * max_draft                             # decayed count of real tries
        self.accepted = [prior_accept * prior_weight] * max_draft    # pseudo-counts per position
        self.tried = [prior_weight] * max_draft
        self.prior = (prior_accept * prior_weight, prior_weight)
        self.costs = costs or CostModel()
        self.since_probe: dict[int, int] = {}     # batch size -> plain steps there since its last probe
        self.probe_gaps: dict[int, int] = {}      # batch size -> steps to wait between probes there
        self.max_probe_gap = max_probe_gap * probe_every
        self.off, self.probing = False, 0         # probing: rows the scheduler gives k = 1 this step (0: none)
        self.last_batch, self.last_drafting = 1, 1
        self.stretches = LoadStretches()          # how long the load stays at a size it dropped to
        self.catch_up = FeedCost()                # what feeding a draft costs, measured call by call
        self.left_on: dict[int, bool] = {}        # batch size -> whether its last full step speculated
        self.observations = 0                     # acceptances observed (part of what _row_rates' memo is valid for)
        self._row_rates_memo: tuple = (None, None)  # (what it was weighed on, _row_rates' answer)

    def acceptance(self) -> list[float]:
        rates, last = [], None
        for a, t, seen in zip(self.accepted, self.tried, self.observed):
            last = a / t if seen >= 1.0 or last is None else last
            rates.append(last)
        return rates

    def expected_tokens(self, k: int) -> float:
        total, run = 1.0, 1.0
        for a in self.acceptance()[:k]:
            run *= a
            total += run
        return total

    def expected_accepted(self, k: int) -> float:
        return self.expected_tokens(k) - 1.0 if k else 0.0

    def step_cost(self, k: int, batch: int = 1, drafting: int | None = None) -> float | None:
        verify = self.costs.verify(batch * (k + 1), batch)
        draft = self.costs.draft(drafting or batch) if k else 0.0
        if verify is None or draft is None:
            return None
        return verify + k * draft

    def next_k(self, max_k: int, batch: int = 1, drafting: int | None = None, rows: int | None = None,
               rows_fed: bool = False) -> int:
        max_k = min(max_k, self.max_draft)
        drafting = batch if drafting is None else min(drafting, batch)
        probed, self.probing = self.probing, 0
        self.stretches.tick(batch)
        if rows_fed and rows is not None and rows < batch and not probed:
            ramp = self._ramp_k(max_k, rows)
            if ramp is not None:
                return ramp
        if drafting == 0:
            return 0                                               # no row can draft: nothing to weigh
        if (self.off and batch == self.last_batch and drafting == self.last_drafting and max_k >= 1
                and not probed):
            # off and nothing learned since (k = 0 steps teach no acceptance): no need to weigh again until the probe
            waited = self.since_probe.get(batch, 0) + 1
            self.since_probe[batch] = waited
            return 0 if waited < self.probe_gap(batch) else self._probe(batch)
        self.last_batch, self.last_drafting = batch, drafting
        costs = [self.step_cost(k, batch) for k in range(max_k + 1)]
        if max_k >= 1 and any(c is None for c in costs[1:]):
            return min(self.warmup_k, max_k)                       # no cost estimates yet: measure first
        if not self.costs.measured(batch, 1):
            # the plain step at this batch size is the baseline every k is weighed against: measure it rather than
            # extrapolate it (a line through the verify sizes tried so far said it cost about what k = 4 cost)
            return 0
        every = self._rates(costs, batch)                          # as if every row drafted: what one row gains
        self.rate = self._per_row(every, batch)[1]                  # one row's tokens/s at the best k (early stop)
        if drafting < batch:
            # the rows that do not draft still pay for the longer verify call (right-padded) and gain nothing
            rate = self._rates([self.step_cost(k, batch, drafting) for k in range(max_k + 1)], batch, drafting=drafting)
        else:
            rate = every
        best = self._best(rate)
        self.off = best == 0
        full = rows is None or rows >= batch
        if best == 0:
            if full:
                self.left_on[batch] = False
            if self.costs.measured(batch, 2) and self._best(self._rates(costs, batch, perfect=True)) == 0:
                self.probe_gaps[batch] = self.max_probe_gap
            elif probed:
                self.probe_gaps[batch] = min(2 * self.probe_gap(batch), self.max_probe_gap)
            return 0
        self.probe_gaps[batch] = self.probe_every
        if batch > 1 and (not self.costs.measured(batch, 2) or (full and self._stale_drafts(batch, rate, best))):
            # k > 0 wins on extrapolated costs, or on a verify of drafts measured long ago: a probe measures it first
            # (once; if it did not measure it, as when its row's draft was too far behind to catch up, the probe
            # clock tries again later). This machine's speed drifts by 20% over a minute, and a plain step measured
            # in a slow burst against a 2-token verify measured before it (0.176 s against 0.188 at B = 4) made
            # k = 1 win by 41% on paper and ran whole waves at k > 0 where target-only was 20% faster. A ramp (fewer
            # rows decode than the load) cannot measure the load's verify, so it goes by the old costs until the
            # load's first full step
            self.off = True
            if full:
                self.left_on[batch] = False
            return 0 if probed else self._probe(batch)
        if rate[best] < RECHECK_MARGIN * rate[0] and self.costs.age(batch, 1) > self.recheck_after and full:
            # while speculation is on the plain step is not measured, and a narrow win rests on its last measurement;
            # only a step of `batch` rows measures it (while sequences still prefill, fewer rows decode: a plain
            # step then measured nothing, and every step of a ramp-up was plain)
            return 0
        best = self._measured_growth(best, batch)
        if full:
            self.left_on[batch] = True
        self.steps += 1
        if self.steps % self.explore_every == 0:
            self.explore_up = not self.explore_up
            return self._measured_growth(min(best + 1, max_k), batch) if self.explore_up else max(best - 1, 1)
        return best

    def _stale_drafts(self, batch: int, rate: list[float], best: int) -> bool:
        """Whether turning speculation on at this batch size (where `best` > 0 wins at `rate`) would rest on a verify
        of drafts (2 tokens a row or more) measured over `recheck_after` steps ago. While speculation is off there the
        plain step is measured every step and the verify of drafts ages: weighed against each other they compare
        two speeds of the machine. A size the load left while speculating there with a clear win (RECHECK_MARGIN)
        resumes without a probe: a drain passes through sizes last seen a wave ago, and a probe at each would cost
        the speculation that wins there; a narrow win is probed again, and its plain step rechecked."""
        if self.costs.drafts_age(batch) <= self.recheck_after:
            return False
        return not (self.left_on.get(batch) and rate[best] >= RECHECK_MARGIN * rate[0])

    def _measured_growth(self, k: int, batch: int) -> int:
        """k, or at most one verify width beyond the widest measured at this batch size: the costs of wider verifies
        are read off a line through narrower ones, and the step that measures a width is the one that grows k past
        it, so k grows a width a step while each width still wins. At B = 8 on the int4 pair a probe measured T = 2
        (1.43x T = 1), the line put T = 6 at 3.1x and k = 5 won on paper by 18%: the step cost 0.52 s of verify
        (3.5x) and 0.30 s of draft calls at 8 rows (read off 1 and 2 rows as 0.19 s), 22 tok/s where plain steps
        ran 53."""
        return min(k, max(self.costs.widest(batch), 1))

    def _ramp_k(self, max_k: int, rows: int) -> int | None:
        """A batch ramping up (sequences still prefilling) whose decoding rows all hold their text in their drafts:
        this step's k only decides this step's cost, so it is weighed for the rows that run it, on what was
        measured at that row count (None: not measured there, weigh the load). Without side effects: the load's
        own state (off, probe clocks, exploration) is left to the steps of the full batch. Weighed for the load of
        8, the ramp of each B = 8 wave with the fp32 target ran k = 1 for a few rows where fixed:4 ran 4.
        Only a clear win (RECHECK_MARGIN) speculates here: a ramp meets each row count for a step or two, so its
        costs there are old and nothing rechecks them. Narrow wins at 4-15 rows on the int4 pair (on costs measured
        one cell earlier) ran k = 2 at 38 tok/s where plain steps ran 64, and left drafts fed just enough for a
        catch-up of 14 rows at B = 16 to look cheap (1.2 s of draft calls for a step that lost too)."""
        costs = [self.step_cost(k, rows) for k in range(max_k + 1)]
        if (any(c is None for c in costs) or not self.costs.measured(rows, 1)
                or (rows > 1 and not self.costs.measured(rows, 2))):
            return None
        rate = self._rates(costs, rows)
        best = self._best(rate)
        return self._measured_growth(best, rows) if best == 0 or rate[best] >= RECHECK_MARGIN * rate[0] else None

    def probe_gap(self, batch: int) -> int:
        return self.probe_gaps.get(batch, self.probe_every)

    def _probe(self, batch: int) -> int:
        """k = 1 for one row (two while the draft was timed at one row count only, so its growth with rows gets
        measured rather than assumed): the scheduler reads `probing`."""
        self.since_probe[batch] = 0
        self.probing = 1 if batch == 1 or len(self.costs.draft.seen) >= 2 else 2
        return 1

    def _rates(self, costs: list[float], batch: int, perfect: bool = False, drafting: int | None = None) -> list[float]:
        """Committed tokens/s of the batch at each k: `drafting` of its rows (None: all) draft, the others commit
        one token a step (perfect: as if every draft were accepted)."""
        drafting = batch if drafting is None else drafting
        expected, run, rate = 1.0, 1.0, []                       # E(k), built up position by position
        acceptance = [1.0] * self.max_draft if perfect else self.acceptance()
        for k, a in zip(range(len(costs)), [None] + acceptance):
            if k:
                run *= a
                expected += run
            rate.append((drafting * expected + batch - drafting) / costs[k] if costs[k] else -math.inf)
        return rate

    def _row_rates(self, batch: int) -> tuple[float, float, float] | None:
        """(plain, best) tokens/s of one row at this batch size if every row drafted, and the tokens it commits a
        step at that best k; None: not measured there."""
        # asked for each row, each step: weighed once for what was observed (acceptances, the cost clock, draft costs)
        key = (batch, self.observations, self.costs.steps, tuple(self.costs.draft.seen.values()))
        if self._row_rates_memo[0] != key:
            costs = [self.step_cost(k, batch) for k in range(self.max_draft + 1)]
            known = not any(c is None for c in costs) and self.costs.measured(batch, 1)
            self._row_rates_memo = (key, self._per_row(self._rates(costs, batch), batch) if known else None)
        return self._row_rates_memo[1]

    def _per_row(self, rate: list[float], batch: int) -> tuple[float, float, float]:
        """The batch's rates at each k -> (plain, best) tokens/s of one row, and the tokens it commits a step at that
        best k."""
        best = max(rate)
        return rate[0] / batch, best / batch, self.expected_tokens(rate.index(best))

    def _best(self, rate: list[float]) -> int:
        positive = max(rate[1:], default=-math.inf)
        if positive > (1 + self.tie) * rate[0]:           # k > 0 must beat the plain step by more than a tie
            return max(k for k in range(1, len(rate)) if rate[k] >= (1 - self.tie) * positive)
        return 0

    def speculates_at(self, batch: int) -> bool:
        """The weighing of next_k at this batch size with every row drafting, without its side effects. Unweighed
        sizes: only a lone sequence speculates from the start (it will measure); a batch measures its plain step
        first anyway, so a joining prompt goes to the draft only once speculation has won at that size (else it
        catches up then). The size weighed last keeps its verdict unless some rows could not draft then (their
        drafts were not fed their text): off for that reason alone, it is weighed again as if all drafted. A size
        above 1 whose verify of drafts is old (`_stale_drafts`) does not: next_k probes there before it turns on (a
        ramp aside, which goes by the old costs, so a prompt joining it may have to catch up)."""
        if batch == self.last_batch and (not self.off or self.last_drafting == batch):
            return not self.off
        costs = [self.step_cost(k, batch) for k in range(self.max_draft + 1)]
        if any(c is None for c in costs) or not self.costs.measured(batch, 1):
            return batch == 1
        rate = self._rates(costs, batch)
        best = self._best(rate)
        return best > 0 and (batch == 1 or not self._stale_drafts(batch, rate, best))

    def catch_up_pays(self, behind: int, remaining: int, batch: int | None = None, unfed: int = 1) -> bool:
        """Feeding `behind` tokens (a prompt, or text missed while off) costs about a draft prefill of them, as the
        feeds measured call by call say (a call's fixed cost plus a cost a token: `catch_up`, a FeedCost).
        Speculating over the `remaining` tokens saves 1/plain - 1/best seconds a token, from the per-row rates at this
        batch size (None: as last weighed) with every row drafting: that is the whole batch's wall time, since its
        rows step together, and it takes every row's draft holding its text. So the saving is shared among the
        `unfed` rows that lack it (this one included; those already fed are paid for): each repays 1/unfed of it.
        Counted whole for each, the first wave of 8 on the int4 pair fed 6 drafts 242 tokens in one step (1.3 s, 7%
        of the wave) for a step of k = 2, after which speculation went off again; divided by the batch size instead,
        a second row joining a wave of 2 whose first row was fed went unfed where speculating pays (+4% for fixed:4).
        Until feeding has been measured, and for a probe (off, nothing is expected to be saved: the probe is what
        finds out): behind <= remaining. A prompt fed to the draft for 64 tokens at B = 2, where speculating gained
        3% on the int4 pair, cost more (a draft prefill is half a target prefill there) than it saved.
        Where the batch has just shrunk to this size, the tokens that can repay it are also capped by how long the
        load stayed at this size after earlier shrinks (LoadStretches) at the tokens a step the best k commits:
        a lone row between two requests at two clients caught up 14-25 tokens for one or two speculative steps."""
        # weighed afresh: the rates of the last weighing go stale while speculation is off (it does not weigh again
        # until its probe), and the second row of each wave of 2 in `bench --batch` was judged by a weighing made
        # after the warm-up, on unmeasured costs at B = 2 (+1.4% where the costs measured since said about +8%)
        plain, best, tokens = self._row_rates(self.last_batch if batch is None else batch) or (None, None, None)
        steps = self.stretches.steps_left(self.last_batch if batch is None else batch)
        if steps is not None and tokens:
            remaining = min(remaining, steps * tokens)
        cost = self.catch_up(behind)
        if cost is None or not plain or not best or best <= plain:
            return behind <= remaining
        saved = (1.0 / plain - 1.0 / best) / max(unfed, 1)
        return remaining * saved >= cost

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        if tokens:
            self.catch_up.observe(tokens, seconds)

    def observe_idle(self) -> None:
        self.stretches.idle()

    def keep_drafting(self, confidences: list[float]) -> bool:
        n = len(confidences)
        if not self.early_stop or self.rate is None or n >= self.max_draft:
            return True
        b = self.last_batch
        verify_next, verify_now = self.costs.verify(b * (n + 2), b), self.costs.verify(b * (n + 1), b)
        draft = self.costs.draft(b)
        if verify_next is None or verify_now is None or draft is None:
            return True
        step_cost = (draft + max(verify_next - verify_now, 0.0)) / b
        reach = math.prod(self.calibration.acceptance(c) for c in confidences)
        return reach * self.acceptance()[n] >= self.rate * step_cost

    def observe_confidences(self, confidences: list[float], n_accepted: int) -> None:
        self.calibration.observe(confidences, n_accepted)

    def observe_costs(self, k: int, draft_s: float, verify_s: float, verify_tokens: int, batch: int = 1,
                      draft_rows: int | None = None) -> None:
        """draft_rows: rows in the step's draft calls when fewer than the batch drafted (a probe)."""
        self.costs.observe_verify(verify_tokens, verify_s, batch)
        if k:
            self.costs.observe_draft(draft_rows or batch, draft_s / k)

    def observe_acceptance(self, k: int, n_accepted: int) -> None:
        # position i was tried iff all before it were accepted; forgetting pulls towards the prior
        self.observations += 1
        a0, t0 = self.prior
        for i in range(min(k, n_accepted + 1)):
            self.accepted[i] = self.forget * self.accepted[i] + (1 - self.forget) * a0 + (1.0 if i < n_accepted else 0.0)
            self.tried[i] = self.forget * self.tried[i] + (1 - self.forget) * t0 + 1.0
            self.observed[i] = self.forget * self.observed[i] + 1.0


POLICY_NAMES = ("target", "fixed:K", "heuristic", "adaptive", "adaptive:stop")


def make_policy(spec: str, max_draft: int) -> Policy:
    """'fixed:K' | 'heuristic' | 'adaptive[:stop]' | 'target' -> a new policy object."""
    name, _, arg = spec.partition(":")
    if name == "target" and not arg:
        return FixedPolicy(0)
    if name == "fixed" and arg:
        try:
            k = int(arg)
        except ValueError:
            raise OptionError(f"policy '{spec}': K must be an integer") from None
        if not 0 <= k <= max_draft:
            raise OptionError(f"policy '{spec}': K must be between 0 and the bundle's max_draft {max_draft}")
        return FixedPolicy(k)
    if name == "heuristic" and not arg:
        return HeuristicPolicy(limit=max_draft, start=min(5, max_draft))
    if name == "adaptive" and arg in ("", "stop"):
        return AdaptivePolicy(max_draft, early_stop=arg == "stop")
    hint = f"; use --drafter {name}" if name in ("ngram", "hybrid") else ""
    raise OptionError(f"unknown policy '{spec}' (known: {', '.join(POLICY_NAMES)}){hint}")
