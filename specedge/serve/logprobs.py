"""Log probabilities in OpenAI's shapes: chat's `logprobs.content` entries ({token, logprob, bytes, top_logprobs})
and completions' legacy block ({tokens, token_logprobs, top_logprobs, text_offset}).

A token's text is the tokenizer's decoding of it alone (a piece of a multi-byte character decodes to U+FFFD);
its `bytes` are the exact bytes it stands for, read from the vocabulary: byte-level BPE (GPT-2, Qwen, Llama 3)
through the byte-to-character table, byte-fallback pieces `<0xNN>` as that byte, SentencePiece's `▁` as a space.
"""

from __future__ import annotations

import re

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's table, inverted: the printable character standing for each byte -> the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenText:
    """Token id -> (text, bytes), cached."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = type(tokenizer.decoder).__name__ == "ByteLevel"
        self._bytes = _byte_level_decoder() if self.byte_level else {}
        self._added = set(tokenizer.get_added_tokens_decoder())     # special and added tokens: their own text
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        if token not in self._cache:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            self._cache[token] = (text, list(self._raw(token, text)))
        return self._cache[token]

    def _raw(self, token: int, text: str) -> bytes:
        piece = self.tokenizer.id_to_token(token)
        if piece is None:
            return text.encode("utf-8")
        if token in self._added:
            return piece.encode("utf-8")
        single = _BYTE_PIECE.fullmatch(piece)
        if single:
            return bytes([int(single.group(1), 16)])
        if self.byte_level and all(c in self._bytes for c in piece):
            return bytes(self._bytes[c] for c in piece)
        return piece.replace("▁", " ").encode("utf-8") if "▁" in piece else text.encode("utf-8")


def chat_logprobs(entries, texts: TokenText) -> dict:
    """-> a chat choice's `logprobs` ({"content": [...], "refusal": None})."""
    def one(token: int, logprob: float) -> dict:
        text, raw = texts(token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries, texts: TokenText, offset: int = 0) -> dict:
    """-> a completion choice's legacy `logprobs` block; offset: the text's length before these tokens."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        text = texts(e.token)[0]
        tokens.append(text)
        offset += len(text)
    top = []
    for e in entries:
        alternatives = {}
        for t, lp in e.top:
            alternatives.setdefault(texts(t)[0], lp)       # two ids may decode alike: the likelier one is kept
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": top if any(e.top for e in entries) else None, "text_offset": offsets}
