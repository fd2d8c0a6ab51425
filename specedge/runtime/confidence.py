"""How often a draft token of a given confidence is accepted, learned online (the adaptive policy's early stop)."""

from __future__ import annotations


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
