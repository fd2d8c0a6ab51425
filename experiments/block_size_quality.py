"""How close int4 bundles stay to their source on real text: perplexity and top-1 agreement, teacher-forced.

    python experiments/block_size_quality.py SOURCE.gguf BUNDLE [BUNDLE ...] [--tokens 1024] [--windows 2]

The text is this repository's own Python source (specedge/runtime/*.py, sorted, concatenated), cut into --windows
windows of --tokens tokens. The reference is transformers on the source dequantized to float32 (what the export
check calls the source model); each bundle's target reads the same windows through its step graph (prefill in
chunks, the logits of every row). Prints per model: perplexity of the text, top-1 agreement with the reference,
and the mean over positions of the largest |logit difference|; then each bundle after the first against the first,
position by position: where only one of the two agrees with the reference (with a two-sided sign test), and the
mean difference of the per-token log-loss with its standard error (both take positions as independent, which
neighbouring tokens are not: the true uncertainty is larger).
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np


def text_ids(tokenizer, tokens: int, windows: int) -> list[list[int]]:
    files = sorted(Path("specedge/runtime").glob("*.py"))
    ids = tokenizer.encode("\n".join(f.read_text() for f in files)).ids
    if len(ids) < tokens * windows:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {tokens} x {windows}")
    return [ids[i * tokens: (i + 1) * tokens] for i in range(windows)]


def bundle_logits(bundle: Path, windows: list[list[int]]) -> list[np.ndarray]:
    """[tokens, V] per window: the target's logits of every row, fed a chunk (its max_step) at a time."""
    from specedge.runtime import load
    from specedge.runtime.backends.base import SlotCursor

    gen = load(bundle, prompt_cache=False)                   # single steps as one or two rows, as the probe chose
    step, out = gen.target.max_step, []
    for window in windows:
        cursor, rows = SlotCursor(gen.target), []
        for at in range(0, len(window), step):
            chunk = window[at: at + step]
            rows.append(cursor.feed(chunk, last=len(chunk)).copy())
        out.append(np.concatenate(rows)[:, : gen.vocab_size])
    return out


def reference_logits(source: str, windows: list[list[int]]) -> list[np.ndarray]:
    import torch
    import transformers

    path = Path(source)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              torch_dtype=torch.float32)
    with torch.no_grad():
        return [model(torch.tensor([w])).logits[0].float().numpy() for w in windows]


def per_position(logits: np.ndarray, window: list[int], reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (negative log-likelihood of each next token [T - 1], top-1 agreement with the reference [T])."""
    shifted = logits[:-1] - logits[:-1].max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -log_probs[np.arange(len(window) - 1), window[1:]], logits.argmax(-1) == reference.argmax(-1)


def sign_test(wins: int, losses: int) -> float:
    """Two-sided p-value of wins against losses under a fair coin."""
    n, k = wins + losses, min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def paired(first: list[np.ndarray], other: list[np.ndarray], windows, references) -> str:
    a = [per_position(lg, w, ref) for lg, w, ref in zip(first, windows, references)]
    b = [per_position(lg, w, ref) for lg, w, ref in zip(other, windows, references)]
    agree_a, agree_b = (np.concatenate([x[1] for x in side]) for side in (a, b))
    loss = np.concatenate([y[0] - x[0] for x, y in zip(a, b)])                  # this bundle's minus the first's
    only_a, only_b = int((agree_a & ~agree_b).sum()), int((agree_b & ~agree_a).sum())
    error = loss.std(ddof=1) / np.sqrt(len(loss))
    return (f"agrees where the first does not {only_b}, the reverse {only_a} (sign test p = "
            f"{sign_test(only_b, only_a):.3f}); log-loss {loss.mean():+.4f} +- {error:.4f} a token")


def scores(logits: np.ndarray, window: list[int], reference: np.ndarray) -> tuple[float, float, float]:
    nll, agree = per_position(logits, window, reference)
    return float(nll.mean()), float(agree.mean()), float(np.abs(logits - reference).max(-1).mean())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--windows", type=int, default=2)
    args = parser.parse_args(argv)
    from tokenizers import Tokenizer

    windows = text_ids(Tokenizer.from_file(str(Path(args.bundles[0]) / "tokenizer.json")), args.tokens, args.windows)
    references = reference_logits(args.source, windows)
    names = [Path(bundle).name for bundle in args.bundles]
    if len(set(names)) < len(names):
        raise SystemExit(f"bundles are told apart by folder name; these repeat: {', '.join(names)}")
    models = {"source (float32)": references}
    for bundle in args.bundles:
        models[Path(bundle).name] = bundle_logits(Path(bundle), windows)
    print(f"{len(windows)} windows x {args.tokens} tokens of specedge/runtime/*.py")
    for name, logits in models.items():
        nll, agree, diff = (np.mean(v) for v in zip(*(scores(lg, w, ref)
                                                      for lg, w, ref in zip(logits, windows, references))))
        print(f"{name:<20} perplexity {np.exp(nll):7.4f}  top-1 agreement with the source {agree:.4f}  "
              f"mean max |logit diff| {diff:.3f}")
    first = Path(args.bundles[0]).name
    for bundle in args.bundles[1:]:
        name = Path(bundle).name
        print(f"{name} against {first}: {paired(models[first], models[name], windows, references)}")


if __name__ == "__main__":
    main(sys.argv[1:])
