"""Rejected-token analytics: at each row's first rejection in a step, where it happened (draft position), what
the draft proposed, what the target wanted, both probabilities when sampling, and each token's class
(whitespace, newline, identifier, keyword, number, punctuation, mixed, special, byte: part of a multi-byte
character, unknown: no text). Aggregated since start and as recent samples; fed on the worker thread once per
step, read by GET /v1/speculation/rejections.
"""

from __future__ import annotations

import keyword
import threading
import time
from collections import Counter, deque

CLASSES = ("whitespace", "newline", "identifier", "keyword", "number", "punctuation", "mixed", "special", "byte",
           "unknown")
MAX_PAIRS = 50_000          # distinct (draft, target) token pairs kept; the rarest are dropped beyond it


def token_class(text: str, special: bool = False) -> str:
    """The class of one token's text."""
    if special:
        return "special"
    if not text:
        return "unknown"                      # an id the tokenizer has no text for (a padded vocabulary row)
    if "\ufffd" in text:
        return "byte"                         # part of a multi-byte character
    stripped = text.strip()
    if not stripped:
        return "newline" if "\n" in text or "\r" in text else "whitespace"
    if stripped.replace(".", "", 1).replace("_", "").isdigit():
        return "number"
    if stripped.isidentifier():
        return "keyword" if keyword.iskeyword(stripped) else "identifier"
    if all(not c.isalnum() and not c.isspace() and c != "_" for c in stripped):
        return "punctuation"
    return "mixed"


class RejectionLog:
    """Aggregates StepRecord.rejections. decode(ids) -> text; special_ids: tokens classed as special."""

    def __init__(self, decode, special_ids=(), recent: int = 200):
        self.decode, self.special_ids = decode, frozenset(special_ids)
        self._lock = threading.Lock()
        self._info: dict[int, tuple[str, str]] = {}          # token id -> (text, class)
        self.total = 0
        self.steps = 0
        self.drafted_at: Counter = Counter()                 # draft position (1-based) -> drafts made there
        self.reached_at: Counter = Counter()                 # ... drafts the target judged (all before accepted)
        self.by_position: Counter = Counter()                # position of the first rejection -> count
        self.by_draft_class: Counter = Counter()
        self.by_target_class: Counter = Counter()
        self.class_pairs: Counter = Counter()                # (draft class, target class)
        self.pairs: Counter = Counter()                      # (draft id, target id)
        self.sampled = 0
        self.sum_p_draft = 0.0                               # target's probability of the rejected draft token
        self.sum_q_draft = 0.0                               # draft's probability of it
        self.recent: deque = deque(maxlen=recent)

    def info(self, token: int) -> tuple[str, str]:
        if token not in self._info:
            text = self.decode([token])
            self._info[token] = (text, token_class(text, token in self.special_ids))
        return self._info[token]

    def observe_step(self, record) -> None:
        with self._lock:
            self.steps += 1
            for k, n in zip(record.k, record.accepted):
                for pos in range(1, k + 1):
                    self.drafted_at[pos] += 1
                for pos in range(1, min(n + 1, k) + 1):
                    self.reached_at[pos] += 1
            for r in record.rejections:
                self.total += 1
                d_text, d_class = self.info(r["draft_token"])
                t_text, t_class = self.info(r["target_token"])
                self.by_position[r["position"]] += 1
                self.by_draft_class[d_class] += 1
                self.by_target_class[t_class] += 1
                self.class_pairs[(d_class, t_class)] += 1
                self.pairs[(r["draft_token"], r["target_token"])] += 1
                if len(self.pairs) > MAX_PAIRS:
                    self.pairs = Counter(dict(self.pairs.most_common(MAX_PAIRS // 2)))
                sample = {"time": time.time(), "batch_size": record.batch, "position": r["position"],
                          "draft_token": r["draft_token"], "draft_text": d_text, "draft_class": d_class,
                          "target_token": r["target_token"], "target_text": t_text, "target_class": t_class}
                if "p_draft" in r:
                    self.sampled += 1
                    self.sum_p_draft += r["p_draft"]
                    self.sum_q_draft += r["q_draft"]
                    sample.update(p_target=r["p_draft"], q_draft=r["q_draft"])
                self.recent.append(sample)

    def snapshot(self, top: int = 20, recent: int = 50) -> dict:
        with self._lock:
            positions = sorted(set(self.drafted_at) | set(self.by_position))
            top_pairs = []
            for (d, t), n in self.pairs.most_common(top):
                (d_text, d_class), (t_text, t_class) = self.info(d), self.info(t)
                top_pairs.append({"draft_token": d, "draft_text": d_text, "draft_class": d_class, "target_token": t,
                                  "target_text": t_text, "target_class": t_class, "count": n})
            return {
                "rejections": self.total,
                "steps": self.steps,
                "by_position": [{"position": p, "drafted": self.drafted_at[p], "judged": self.reached_at[p],
                                 "rejected": self.by_position[p],
                                 "rejection_rate": (self.by_position[p] / self.reached_at[p]
                                                    if self.reached_at[p] else None)}
                                for p in positions],
                "by_draft_class": dict(self.by_draft_class.most_common()),
                "by_target_class": dict(self.by_target_class.most_common()),
                "class_pairs": [{"draft_class": d, "target_class": t, "count": n}
                                for (d, t), n in self.class_pairs.most_common()],
                "top_pairs": top_pairs,
                "sampled": {"rejections": self.sampled,
                            "mean_p_target": self.sum_p_draft / self.sampled if self.sampled else None,
                            "mean_q_draft": self.sum_q_draft / self.sampled if self.sampled else None},
                "recent": list(self.recent)[-recent:] if recent > 0 else [],
                "classes": list(CLASSES),
            }
