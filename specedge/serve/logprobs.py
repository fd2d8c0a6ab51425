"""Log probabilities in OpenAI's shapes: chat's `logprobs.content` entries ({token, logprob, bytes, top_logprobs})
and completions' legacy block ({tokens, token_logprobs, top_logprobs, text_offset}).

A token's `bytes` are the exact bytes it stands for, read from the vocabulary: byte-level BPE (GPT-2, Qwen,
Llama 3) through the byte-to-character table, byte-fallback pieces `<0xNN>` as that byte, SentencePiece's `▁` as a
space; special and added tokens as their own text. Its `token` string is those bytes as UTF-8, or, where they are
a piece of a multi-byte character, `bytes:` and their escapes (`bytes:\\xe2\\x82`), as OpenAI names them.
"""

from __future__ import annotations

import codecs
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
    """Token id -> (token string, bytes), cached; and which tokens the response text leaves out (special ones)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = type(tokenizer.decoder).__name__ == "ByteLevel"
        self._bytes = _byte_level_decoder() if self.byte_level else {}
        added = tokenizer.get_added_tokens_decoder()
        self._added = set(added)                                    # special and added tokens: their own text
        self.special = {i for i, t in added.items() if t.special}   # not in the text (decoded skipping them)
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        if token not in self._cache:
            raw = self._raw(token)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:                              # a piece of a character
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._cache[token] = (text, list(raw))
        return self._cache[token]

    def _raw(self, token: int) -> bytes:
        piece = self.tokenizer.id_to_token(token)
        if piece is None:
            return self.tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")
        if token in self._added:
            return piece.encode("utf-8")
        single = _BYTE_PIECE.fullmatch(piece)
        if single:
            return bytes([int(single.group(1), 16)])
        if self.byte_level and all(c in self._bytes for c in piece):
            return bytes(self._bytes[c] for c in piece)
        return piece.replace("▁", " ").encode("utf-8")


def _continues(pending: bytes, raw: bytes) -> bool:
    """Whether raw's first bytes continue the unfinished UTF-8 character `pending` (complete it or not yet)."""
    lead = pending[0]
    size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(pending + raw[: size - len(pending)])
    except UnicodeDecodeError:
        return False
    return True


class TextOffsets:
    """Completions' text_offset: where each token's text starts in the response text (from 0: no echo), counted
    on the text itself, so a character split across tokens and a special token (left out of the text) do not
    shift the tokens after them. One per response; a stream carries it from chunk to chunk."""

    def __init__(self, texts: TokenText):
        # as the text is decoded: invalid bytes become U+FFFD, an unfinished character waits for its other bytes
        self.texts, self._decoder, self._length = texts, codecs.getincrementaldecoder("utf-8")("replace"), 0

    def next(self, token: int) -> int:
        if token in self.texts.special:
            return self._length
        raw, at = bytes(self.texts(token)[1]), self._length
        pending = self._decoder.getstate()[0]           # the first bytes of a character still unfinished
        if pending and not _continues(pending, raw):
            at += 1                                     # they turn out invalid: one U+FFFD before this token
        self._length += len(self._decoder.decode(raw))
        return at


def chat_logprobs(entries, texts: TokenText) -> dict:
    """-> a chat choice's `logprobs` ({"content": [...], "refusal": None})."""
    def one(token: int, logprob: float) -> dict:
        text, raw = texts(token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    content = [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries, offsets: TextOffsets) -> dict:
    """-> a completion choice's legacy `logprobs` block. `top_logprobs`: per token, the alternatives asked for and
    the chosen token itself (so up to n + 1 entries, as OpenAI's API); two ids with the same string keep the
    likelier."""
    texts = offsets.texts
    top = []
    for e in entries:
        alternatives = {}
        for t, lp in (*e.top, (e.token, e.logprob)):
            alternatives.setdefault(texts(t)[0], lp)
        top.append(alternatives)
    return {"tokens": [texts(e.token)[0] for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": top, "text_offset": [offsets.next(e.token) for e in entries]}


def echoed_logprobs(prompt_ids: list[int], entries, offsets: TextOffsets) -> dict:
    """-> the legacy block of an echoed prompt: its first token has no logprob (null, as OpenAI's), each other
    token its own (entries: the generator's prompt_logprobs, one per prompt token after the first)."""
    if entries is None or len(entries) != len(prompt_ids) - 1:   # not known (cut off in its prefill): tokens alone
        n = len(prompt_ids)
        return {"tokens": [offsets.texts(t)[0] for t in prompt_ids], "token_logprobs": [None] * n,
                "top_logprobs": [None] * n, "text_offset": [offsets.next(t) for t in prompt_ids]}
    first = prompt_ids[0]
    at = offsets.next(first)
    rest = completion_logprobs(entries, offsets)
    return {"tokens": [offsets.texts(first)[0]] + rest["tokens"], "token_logprobs": [None] + rest["token_logprobs"],
            "top_logprobs": [None] + rest["top_logprobs"], "text_offset": [at] + rest["text_offset"]}


def joined(first: dict, second: dict) -> dict:
    """Two legacy blocks, one after the other (an echoed prompt's, then the completion's)."""
    return {key: first[key] + second[key] for key in first}
