"""A lighter draft head: the draft's LM head keeps only the N most frequent tokens of a corpus.

The draft then proposes only from that subset; the target still decides every token, and speculative
sampling treats the draft's distribution as zero outside it, so output stays exact. The subset is
stored in the bundle as DRAFT_VOCAB_FILE (sorted token ids).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from specedge.errors import ExportError

DRAFT_VOCAB_FILE = "draft_vocab.json"
TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".c", ".h", ".cpp", ".js", ".ts", ".java", ".go", ".rs", ".json",
                 ".jsonl", ".toml", ".yaml", ".yml", ".html", ".css", ".sh"}


def corpus_texts(path: str | Path) -> list[str]:
    """A text file, a JSONL file (its "prompt" or "text" fields), or a folder of text/source files."""
    root = Path(path).expanduser()
    if not root.exists():
        raise ExportError(f"--draft-vocab-from {path}: no such file or folder")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES) if root.is_dir() else [root]
    texts = []
    for file in files:
        text = file.read_text(errors="replace")
        if file.suffix == ".jsonl":
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    texts += [row[k] for k in ("prompt", "text") if isinstance(row.get(k), str)]
        else:
            texts.append(text)
    if not any(t.strip() for t in texts):
        raise ExportError(f"--draft-vocab-from {path}: no text found")
    return texts


def token_counts(tokenizer, texts: list[str], vocab_size: int) -> Counter:
    counts = Counter()
    for text in texts:
        counts.update(i for i in tokenizer.encode(text, add_special_tokens=False) if i < vocab_size)
    return counts


def choose_subset(counts: Counter, size: int, vocab_size: int, always: list[int]) -> np.ndarray:
    """-> the `size` most frequent token ids (`always` first), sorted [size]. Unseen tokens fill the rest
    in id order (a BPE vocabulary is roughly ordered by merge frequency)."""
    if not 1 <= size <= vocab_size:
        raise ExportError(f"--draft-vocab must be between 1 and the vocabulary size {vocab_size}, got {size}")
    keep = [i for i in dict.fromkeys(always) if i < vocab_size][:size]
    chosen = set(keep)
    for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(keep) == size:
            break
        if token not in chosen:
            keep.append(token)
            chosen.add(token)
    filler = (i for i in range(vocab_size) if i not in chosen)
    while len(keep) < size:
        keep.append(next(filler))
    return np.array(sorted(keep), np.int64)


def coverage(counts: Counter, subset: np.ndarray) -> float:
    """Share of the corpus's tokens that lie in the subset."""
    total = sum(counts.values())
    return sum(counts[i] for i in subset.tolist()) / total if total else 0.0
