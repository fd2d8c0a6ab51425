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


# tokens that end a middle besides the bundle's eos ids, where the vocabulary has them: the markers themselves and
# the families' padding and file separators (a model that emits one has left the gap)
ENDS = ("<|fim_pad|>", "<|file_sep|>", "<|file_separator|>", "<|repo_name|>", "<file_sep>", "<|endoftext|>")


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    bos: tuple[int, ...]            # what the tokenizer puts before the text (a BOS token), if anything
    ends: frozenset[int]            # ids that end the middle (with the eos ids)


def find_fim(tokenizer) -> FimTokens | None:
    """The tokenizer's fill-in-the-middle tokens, or None where it has none of the known sets."""
    for names in KNOWN:
        ids = [tokenizer.token_to_id(name) for name in names]
        if all(i is not None for i in ids):
            ends = {tokenizer.token_to_id(name) for name in ENDS} - {None}
            return FimTokens(*ids, bos=_leading_specials(tokenizer), ends=frozenset(ends | set(ids)))
    return None


def _leading_specials(tokenizer) -> tuple[int, ...]:
    """What the tokenizer's post-processing puts before a text (a BOS), not what it appends (an EOS)."""
    marked = tokenizer.encode("x", add_special_tokens=True).ids
    plain = tokenizer.encode("x", add_special_tokens=False).ids
    for at in range(len(marked) - len(plain) + 1):
        if marked[at: at + len(plain)] == plain:
            return tuple(marked[:at])
    return ()


def fim_ids(tokenizer, fim: FimTokens, prefix: str, suffix: str) -> list[int]:
    """The prompt ids for writing what goes between prefix and suffix."""
    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    return [*fim.bos, fim.prefix, *plain(prefix), fim.suffix, *plain(suffix), fim.middle]
