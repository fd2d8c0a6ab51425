"""Fill-in-the-middle: code models trained to write what goes between a prefix and a suffix (an editor's cursor)
mark the three parts with special tokens; the prompt is [prefix token] prefix [suffix token] suffix [middle
token], and the model writes the middle, ending with an end-of-text token.

Which tokens a model uses is a property of its tokenizer, so the runtime reads them from the bundle's tokenizer:
the first of the known sets whose three tokens it has.
"""

from __future__ import annotations

from dataclasses import dataclass

# (prefix, suffix, middle) marker tokens, prefix-suffix-middle order
KNOWN = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),      # Qwen2.5-Coder, CodeGemma
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),            # StarCoder, StarCoder2, SantaCoder
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),            # DeepSeek-Coder
)


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    bos: tuple[int, ...]            # what the tokenizer puts before any text (a BOS token), if anything


def find_fim(tokenizer) -> FimTokens | None:
    """The tokenizer's fill-in-the-middle tokens, or None where it has none of the known sets."""
    for names in KNOWN:
        ids = [tokenizer.token_to_id(name) for name in names]
        if all(i is not None for i in ids):
            return FimTokens(*ids, bos=tuple(tokenizer.encode("", add_special_tokens=True).ids))
    return None


def fim_ids(tokenizer, fim: FimTokens, prefix: str, suffix: str) -> list[int]:
    """The prompt ids for writing what goes between prefix and suffix."""
    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    return [*fim.bos, fim.prefix, *plain(prefix), fim.suffix, *plain(suffix), fim.middle]
