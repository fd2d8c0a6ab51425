"""How long the load stays at a batch size once it has dropped to it: what a catch-up at that size can earn.

At two clients a request ends and the next one arrives a few steps later: for those steps the batch is one row,
where speculation wins, so the lone row's draft (behind, because speculation was off at two rows) caught up 14-25
tokens for one or two speculative steps before the batch was two again. Weighed against the row's remaining
tokens that catch-up paid; weighed against how long a batch that shrank to one row stays there, it does not.

Only stretches entered by shrinking are learned and capped: a stretch entered by growing (a lone request, a
request joining) is the one a prompt is fed for, and capping it could stop a run of lone requests from feeding
their prompts (the case where speculation pays most). An engine left with no sequence says so (`idle`): without
it, the next lone request continued the stretch its predecessor's drain had shrunk to, was capped, and through a
server at one client after eight ran all its requests without speculation (2026-12-07).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoadStretches:
    decay: float = 0.7                                         # exponential average of stretch lengths, per size
    mean_steps: dict[int, float] = field(default_factory=dict)  # batch size -> steps a shrunk-to stretch lasted
    batch: int | None = None                                   # the current stretch: its size,
    shrunk: bool = False                                       # whether it began by shrinking,
    elapsed: int = 0                                           # and its steps so far

    def tick(self, batch: int) -> None:
        """One decode step at this load."""
        if batch == self.batch:
            self.elapsed += 1
            return
        if self.shrunk:
            self._learn(self.batch, self.elapsed)
        self.shrunk = self.batch is not None and batch < self.batch
        self.batch, self.elapsed = batch, 1

    def idle(self) -> None:
        """No sequence is left: the current stretch ends here, and whatever comes next begins by growing."""
        if self.batch and self.shrunk:
            self._learn(self.batch, self.elapsed)
        self.batch, self.shrunk, self.elapsed = 0, False, 0

    def _learn(self, batch: int, steps: int) -> None:
        old = self.mean_steps.get(batch)
        self.mean_steps[batch] = steps if old is None else self.decay * old + (1 - self.decay) * steps

    def steps_left(self, batch: int) -> float | None:
        """Expected further steps at this batch size, or None where nothing caps it (the stretch began by growing,
        or no stretch that shrank to this size has ended yet). A size below the current one is a shrink about to
        happen (asked before its first step). Never less than the stretch has lasted so far: one that outlived the
        usual length (the other client went quiet) earns its catch-up after a while."""
        if batch == self.batch:
            shrunk, elapsed = self.shrunk, self.elapsed
        elif self.batch is not None and batch < self.batch:
            shrunk, elapsed = True, 0
        else:
            return None
        if not shrunk or batch not in self.mean_steps:
            return None
        return max(self.mean_steps[batch], float(elapsed))
