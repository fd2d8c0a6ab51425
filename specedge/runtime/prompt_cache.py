"""The prompt cache: free KV slots keep the text of the sequences that left them, and a joining sequence whose
prompt starts with such a text takes that prefix's K/V instead of prefilling it.

Exact where a token's K/V does not depend on the call that computed it (a prefill chunk, a verify call of any
width, a single step, beside any other rows): what speculation and batching already rely on, and what the
generator checks before it turns the cache on (generator.py). The reused K/V is then, byte for byte, what
prefilling the same tokens would write.

Invariant: `held[j]` names tokens whose K/V slot j holds, or is None. A slot is forgotten (None) before anything
is copied into it, and recorded only once the copy is complete, so an error or Ctrl+C part-way through a copy
loses a text but never leaves a false one. Running slots hold nothing here.
"""

from __future__ import annotations

from dataclasses import replace

from specedge.runtime.sequences import HeldText, Sequence


class PromptCache:
    def __init__(self, models, max_batch: int, enabled: bool):
        self.m, self.enabled = models, enabled
        self.held: list[HeldText | None] = [None] * max_batch
        self._clock = 0                                   # stamps texts: the least recently used goes first

    def clear(self) -> None:
        self.held = [None] * len(self.held)

    def count(self) -> int:
        """Texts held now."""
        return sum(text is not None for text in self.held)

    # -- sequences joining --------------------------------------------------------------------------
    def start(self, joining: list[Sequence], free_from: int, running: list[Sequence] = ()) -> None:
        """Sequences just given the slots below `free_from` that no running sequence had (every slot from `free_from`
        on is free). Among those slots each takes the one whose text it reuses most in place (several clients'
        next turns at once: each its own conversation); a finished text its sequence would overwrite in part is
        first kept in a free slot; then each starts from the longest start of its prompt that its slot, a free
        slot, or a running sequence's committed text holds (copied in from a free or a running slot: a system
        prompt shared with a request already running is not prefilled again)."""
        texts = {s.slot: self._forget(s.slot) for s in joining}
        if not self.enabled:
            return
        free = list(range(free_from, len(self.held)))
        self._assign(joining, texts)
        others = [(HeldText.of(r, finished=False, stamp=0), r.slot) for r in running if r.slot not in texts]
        chosen = {}                                       # id(s) -> (length, text, slot): its longest reuse
        for s in joining:
            # the last prompt token is fed: its logits give a token; scoring a prompt needs the logits of all of it
            limit = 0 if s.prompt_logprobs is not None else len(s.prompt_ids) - 1
            sources = [(texts[s.slot], s.slot)] + [(self.held[j], j) for j in free] + others
            chosen[id(s)] = max(((t.common_prefix(s.prompt_ids, limit), t, j) for t, j in sources if t),
                                key=lambda c: c[0], default=(0, None, None))   # max: the first of equals
        sources = {slot for _, _, slot in chosen.values()}
        for s in joining:
            text = texts[s.slot]
            if text is not None and text.finished and text.common_prefix(s.prompt_ids, len(text.tokens)) < len(
                    text.tokens):                         # s would overwrite part of it: keep it, not over a source
                self._keep_elsewhere(text, s.slot, [j for j in free if j not in sources])
        for s in joining:
            length, text, slot = chosen[id(s)]
            if not length:
                continue
            drafted = min(length, text.draft_len)
            if slot != s.slot:                            # the prefix comes from another slot, which keeps it
                self._copy(slot, s.slot, length, drafted)
                if slot >= free_from:                     # a free slot's text was just used (a running one has none)
                    self.held[slot] = replace(text, stamp=self._tick())
            s.prefilled = s.tgt_pos = length
            s.dft_pos = drafted if self.m.draft is not None else 0
            s.stats.cached_prompt_tokens = length

    @staticmethod
    def _assign(joining: list[Sequence], texts: dict) -> None:
        """Permutes the joining sequences' slots so that the longest in-place reuses come first (greedy)."""
        if len(joining) < 2:
            return
        pairs = sorted(((t.common_prefix(s.prompt_ids, len(s.prompt_ids) - 1), -j, i)
                        for i, s in enumerate(joining) for j, t in texts.items() if t is not None), reverse=True)
        slot_of, taken = {}, set()
        for length, j, i in pairs:
            if length and i not in slot_of and -j not in taken:
                slot_of[i] = -j
                taken.add(-j)
        rest = iter(sorted(j for j in texts if j not in taken))
        for i, s in enumerate(joining):
            s.slot = slot_of[i] if i in slot_of else next(rest)

    # -- sequences leaving, and compaction ------------------------------------------------------------
    def leave(self, leaving: list[Sequence], spare: list[int], keep: int) -> None:
        """Records the texts of sequences that ended well (a failed call may have left its K/V half-written). A text
        in a slot below `keep` (compaction will fill it) is copied first into the spare slot of least worth; `spare`:
        the slots from `keep` on that no kept sequence occupies."""
        if not self.enabled:
            return
        for seq in sorted(leaving, key=lambda s: s.slot < keep):      # texts that stay where they are first
            text = HeldText.of(seq, finished=True, stamp=self._tick())
            if text is None:
                continue
            if seq.slot < keep:
                self._keep_elsewhere(text, seq.slot, spare)
            else:
                self.held[seq.slot] = text

    def move(self, seq: Sequence, to: int) -> None:
        """Compaction: seq's K/V into slot `to` (below it). The slot it leaves keeps a copy of its text so far,
        worth less than a finished text (a request sharing its start, a system prompt, can still use it)."""
        self._copy(seq.slot, to, seq.tgt_pos, seq.dft_pos)
        if self.enabled:
            self.held[seq.slot] = HeldText.of(seq, finished=False, stamp=self._tick())

    def running(self, n: int) -> None:
        """Slots 0 .. n - 1 are running: they hold nothing here."""
        for j in range(n):
            self.held[j] = None

    # -- internals -------------------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _forget(self, slot: int) -> HeldText | None:
        text, self.held[slot] = self.held[slot], None
        return text

    def _copy(self, src: int, dst: int, length: int, draft_length: int) -> None:
        self.held[dst] = None                             # never recorded while a copy into it is unfinished
        if length:
            self.m.target.move_slot(src, dst, length)
        if self.m.draft is not None and draft_length:
            self.m.draft.move_slot(src, dst, draft_length)

    def _keep_elsewhere(self, text: HeldText, slot: int, spare) -> None:
        """Copies the text in `slot` (about to be overwritten) into the spare slot of least worth (one holding
        nothing, then a moving sequence's leftover, then the least recently used), if that is worth less."""
        def worth(j: int):
            return (False, -1) if self.held[j] is None else self.held[j].worth      # nothing: least of all

        to = min(spare, key=worth, default=None)
        if to is not None and worth(to) < text.worth:
            self._copy(slot, to, len(text.tokens), text.draft_len)
            self.held[to] = text
