"""Per-request speculation statistics: what was drafted, what the target accepted, and where time went."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0    # of those, taken from the prompt cache instead of prefilled
    new_tokens: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_verify: int = 0                # target calls that checked at least one draft token
    n_target_calls: int = 0          # all target calls after prefill (verify + plain steps)
    n_draft_calls: int = 0
    drafted_at: list[int] = field(default_factory=list)    # [position] drafts made at draft position i
    accepted_at: list[int] = field(default_factory=list)   # [position] of those, accepted by the target
    k_history: list[int] = field(default_factory=list)     # k used per decode step
    rejections: Counter = field(default_factory=Counter)   # (position, draft token, target token) -> count
    accepted_lengths: Counter = field(default_factory=Counter)  # tokens committed per verify call -> count
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0            # target time after prefill
    total_s: float = 0.0
    stop_reason: str = ""

    def record_step(self, k: int, n_accepted: int, drafts: list[int], target_token: int) -> None:
        self.k_history.append(k)
        if k == 0:
            return
        self.n_verify += 1
        self.accepted_lengths[n_accepted + 1] += 1
        self.n_drafted += k
        self.n_accepted += n_accepted
        if len(self.drafted_at) < k:
            grow = k - len(self.drafted_at)
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(k):
            self.drafted_at[i] += 1
        for i in range(n_accepted):
            self.accepted_at[i] += 1
        if n_accepted < k:
            self.rejections[(n_accepted + 1, drafts[n_accepted], target_token)] += 1

    @classmethod
    def combine(cls, runs: list["GenerationStats"]) -> "GenerationStats":
        """The sums over several requests (counts, histograms, times; k_history concatenated)."""
        total = cls()
        for s in runs:
            for name in ("prompt_tokens", "cached_prompt_tokens", "new_tokens", "n_drafted", "n_accepted", "n_verify",
                         "n_target_calls", "n_draft_calls", "prefill_s", "draft_s", "verify_s", "total_s"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            grow = len(s.drafted_at) - len(total.drafted_at)
            if grow > 0:
                total.drafted_at += [0] * grow
                total.accepted_at += [0] * grow
            for i, (d, a) in enumerate(zip(s.drafted_at, s.accepted_at)):
                total.drafted_at[i] += d
                total.accepted_at[i] += a
            total.k_history += s.k_history
            total.rejections.update(s.rejections)
            total.accepted_lengths.update(s.accepted_lengths)
        return total

    @property
    def k_mean(self) -> float:
        return sum(self.k_history) / len(self.k_history) if self.k_history else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verify call, counting the target's own token (vLLM's definition)."""
        return 1.0 + self.n_accepted / self.n_verify if self.n_verify else 1.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_json(self, decode=None, top_rejections: int = 10) -> dict:
        show = decode or (lambda ids: None)
        rejected = [{"position": pos, "draft_token": d, "target_token": t, "count": n,
                     "draft_text": show([d]), "target_text": show([t])}
                    for (pos, d, t), n in self.rejections.most_common(top_rejections)]
        return {
            "prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
            "new_tokens": self.new_tokens,
            "drafted_tokens": self.n_drafted, "accepted_tokens": self.n_accepted,
            "acceptance_rate": self.n_accepted / self.n_drafted if self.n_drafted else 0.0,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_per_position": self.acceptance_per_position,
            "verify_calls": self.n_verify, "target_calls": self.n_target_calls, "draft_calls": self.n_draft_calls,
            "k_mean": self.k_mean,
            "tokens_per_s": self.tokens_per_s,
            "time_s": {"total": self.total_s, "prefill": self.prefill_s, "draft": self.draft_s,
                       "verify": self.verify_s,
                       "other": max(0.0, self.total_s - self.prefill_s - self.draft_s - self.verify_s)},
            "top_rejections": rejected, "stop_reason": self.stop_reason,
        }
