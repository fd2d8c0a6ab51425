"""Speculation policies: how many tokens to draft before the next verify call.

Every policy sees the same feedback after each step (`observe`): how many drafts were proposed and
accepted, and what the draft steps and the verify call cost, with the verify call's total token count
(so a batched server can reuse the cost model). k = 0 means a plain target step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specedge.errors import OptionError


class Policy:
    early_stop = False                # True: ask keep_drafting before each further draft step
    name = "policy"

    def next_k(self, max_k: int) -> int:
        raise NotImplementedError

    def observe(self, k: int, n_accepted: int, draft_s: float, verify_s: float, verify_tokens: int) -> None:
        pass

    def keep_drafting(self, confidences: list[float]) -> bool:
        """Asked before each further draft step, with the confidences of the drafts made so far."""
        return True

    def observe_confidences(self, confidences: list[float], n_accepted: int) -> None:
        pass


class FixedPolicy(Policy):
    def __init__(self, k: int):
        self.k, self.name = k, f"fixed:{k}"

    def next_k(self, max_k: int) -> int:
        return min(self.k, max_k)


class HeuristicPolicy(Policy):
    """Hugging Face assisted generation: +2 after a step where every draft was accepted, -1 otherwise."""

    name = "heuristic"

    def __init__(self, start: int = 5, limit: int = 8):
        self.k, self.limit = start, limit

    def next_k(self, max_k: int) -> int:
        return min(self.k, max_k, self.limit)

    def observe(self, k, n_accepted, draft_s, verify_s, verify_tokens):
        if k == 0:
            return
        self.k = min(self.k + 2, self.limit) if n_accepted == k else max(1, self.k - 1)


@dataclass
class CostModel:
    """Seconds per draft step, and seconds per verify call as a function of its token count.

    Verify costs are kept as an exponential average per token count; an unseen count is read off the
    least-squares line through the seen ones (verification is close to linear in tokens on a CPU).
    """

    decay: float = 0.9
    draft_step_s: float | None = None
    verify_s: dict[int, float] = field(default_factory=dict)

    def observe_draft(self, seconds_per_step: float) -> None:
        self.draft_step_s = _ema(self.draft_step_s, seconds_per_step, self.decay)

    def observe_verify(self, tokens: int, seconds: float) -> None:
        self.verify_s[tokens] = _ema(self.verify_s.get(tokens), seconds, self.decay)

    def verify(self, tokens: int) -> float | None:
        if tokens in self.verify_s:
            return self.verify_s[tokens]
        if not self.verify_s:
            return None
        if len(self.verify_s) == 1:
            (t0, c0), = self.verify_s.items()
            return c0 * (1 + 0.1 * (tokens - t0))  # prior: +10% per extra token (memory-bound CPU)
        xs, ys = zip(*self.verify_s.items())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return max(my + max(slope, 0.0) * (tokens - mx), 1e-9)


class ConfidenceCalibration:
    """P(draft accepted | its confidence), per confidence bin, learned online.

    The prior is a calibrated draft (acceptance = confidence); forgetting follows a change of prompt.
    Only drafts the target actually judged (every earlier one accepted) are counted.
    """

    def __init__(self, bins: int = 10, prior_weight: float = 2.0, forget: float = 0.995):
        mids = [(i + 0.5) / bins for i in range(bins)]
        self.bins, self.forget = bins, forget
        self.prior = [(m * prior_weight, prior_weight) for m in mids]
        self.accepted = [a for a, _ in self.prior]
        self.tried = [t for _, t in self.prior]

    def bin(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def acceptance(self, confidence: float) -> float:
        b = self.bin(confidence)
        return self.accepted[b] / self.tried[b]

    def observe(self, confidences: list[float], n_accepted: int) -> None:
        for i, c in enumerate(confidences[:n_accepted + 1]):
            b = self.bin(c)
            (a0, t0), f = self.prior[b], self.forget
            self.accepted[b] = f * self.accepted[b] + (1 - f) * a0 + (1.0 if i < n_accepted else 0.0)
            self.tried[b] = f * self.tried[b] + (1 - f) * t0 + 1.0


def _ema(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1 - decay) * new


class AdaptivePolicy(Policy):
    """Picks k in [0, max_k] maximising expected tokens per second, E(k) / cost(k).

    E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j, where a_j is the probability that draft position j is
    accepted given that positions before it were: a Beta estimate with a prior (so it starts sensibly)
    and forgetting (so it follows a change). cost(k) = k * draft step + verify(k + 1 tokens).
    A position never tried yet borrows the estimate of the last tried one, and every `explore_every`
    steps it tries one more (then one fewer) than the best k, so the costs of other verify sizes and the
    acceptance of deeper positions get measured. While k = 0 wins, it still probes with k = 1 every
    `probe_every` steps, so it notices when the draft becomes useful again.

    Early stop: before each further draft step it weighs that step's expected gain, P(every draft so far
    is accepted, given their confidences) * a_next, against what the step costs at the current rate
    (tokens/s times draft step + one more verify token); acceptance per confidence is calibrated online,
    so the confidence threshold tunes itself to the draft, the prompt and the costs. Off by default
    ('adaptive:stop' turns it on): on the real pair it stopped too early while the calibration was
    young, 1.64x against 2.49x without it (README).
    """

    name = "adaptive"

    def __init__(self, max_draft: int, prior_accept: float = 0.8, prior_weight: float = 1.0, forget: float = 0.97,
                 probe_every: int = 16, explore_every: int = 4, warmup_k: int = 4, tie: float = 0.02,
                 early_stop: bool = False, costs: CostModel | None = None):
        self.max_draft, self.forget, self.probe_every, self.warmup_k = max_draft, forget, probe_every, warmup_k
        self.explore_every, self.steps, self.explore_up = explore_every, 0, True
        self.tie, self.early_stop, self.rate = tie, early_stop, None
        self.calibration = ConfidenceCalibration()
        self.observed = [0.0] * max_draft                             # decayed count of real tries
        self.accepted = [prior_accept * prior_weight] * max_draft    # pseudo-counts per position
        self.tried = [prior_weight] * max_draft
        self.prior = (prior_accept * prior_weight, prior_weight)
        self.costs = costs or CostModel()
        self.since_probe = 0

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

    def step_cost(self, k: int) -> float | None:
        verify = self.costs.verify(k + 1)
        if verify is None or (k > 0 and self.costs.draft_step_s is None):
            return None
        return verify + (k * self.costs.draft_step_s if k else 0.0)

    def next_k(self, max_k: int) -> int:
        max_k = min(max_k, self.max_draft)
        costs = [self.step_cost(k) for k in range(max_k + 1)]
        if max_k >= 1 and any(c is None for c in costs[1:]):
            return min(self.warmup_k, max_k)                       # no cost estimates yet: measure first
        rate = [self.expected_tokens(k) / costs[k] if costs[k] else -math.inf for k in range(max_k + 1)]
        # near-ties go to the longer draft: acceptance comes in runs, so deep positions beat their estimate
        best = max(k for k in range(max_k + 1) if rate[k] >= (1 - self.tie) * max(rate))
        self.rate = max(rate)
        if best == 0 and max_k >= 1:
            self.since_probe += 1
            if self.since_probe >= self.probe_every:
                self.since_probe = 0
                return 1
            return 0
        self.steps += 1
        if self.steps % self.explore_every == 0:
            self.explore_up = not self.explore_up
            return min(best + 1, max_k) if self.explore_up else max(best - 1, 1)
        return best

    def keep_drafting(self, confidences: list[float]) -> bool:
        n = len(confidences)
        if not self.early_stop or self.rate is None or n >= self.max_draft:
            return True
        extra_verify = self.costs.verify(n + 2) - self.costs.verify(n + 1)
        step_cost = self.costs.draft_step_s + max(extra_verify, 0.0)
        reach = math.prod(self.calibration.acceptance(c) for c in confidences)
        return reach * self.acceptance()[n] >= self.rate * step_cost

    def observe_confidences(self, confidences: list[float], n_accepted: int) -> None:
        self.calibration.observe(confidences, n_accepted)

    def observe(self, k, n_accepted, draft_s, verify_s, verify_tokens):
        self.costs.observe_verify(verify_tokens, verify_s)
        if k == 0:
            return
        self.costs.observe_draft(draft_s / k)
        # position i was tried iff all before it were accepted; forgetting pulls towards the prior
        a0, t0 = self.prior
        for i in range(min(k, n_accepted + 1)):
            self.accepted[i] = self.forget * self.accepted[i] + (1 - self.forget) * a0 + (1.0 if i < n_accepted else 0.0)
            self.tried[i] = self.forget * self.tried[i] + (1 - self.forget) * t0 + 1.0
            self.observed[i] = self.forget * self.observed[i] + 1.0


POLICY_NAMES = ("target", "fixed:K", "heuristic", "adaptive", "adaptive:stop", "ngram", "hybrid")


def make_policy(spec: str, max_draft: int) -> tuple[Policy, str]:
    """'fixed:4' | 'heuristic' | 'adaptive[:stop]' | 'target' | 'ngram[:K]' | 'hybrid[:K]' -> (policy, drafter kind).

    ngram and hybrid pick k like `adaptive` unless given a fixed K.
    """
    name, _, arg = spec.partition(":")
    if name == "target":
        return FixedPolicy(0), "none"
    if name in ("fixed", "ngram", "hybrid") and arg:
        try:
            k = int(arg)
        except ValueError:
            raise OptionError(f"policy '{spec}': K must be an integer") from None
        if not 0 <= k <= max_draft:
            raise OptionError(f"policy '{spec}': K must be between 0 and the bundle's max_draft {max_draft}")
        return FixedPolicy(k), {"fixed": "model"}.get(name, name)
    if name == "heuristic" and not arg:
        return HeuristicPolicy(limit=max_draft, start=min(5, max_draft)), "model"
    if name == "adaptive" and arg == "stop":
        return AdaptivePolicy(max_draft, early_stop=True), "model"
    if name in ("adaptive", "ngram", "hybrid") and not arg:
        return AdaptivePolicy(max_draft), {"adaptive": "model"}.get(name, name)
    raise OptionError(f"unknown policy '{spec}' (known: {', '.join(POLICY_NAMES)})")
