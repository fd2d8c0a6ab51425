"""Token ids -> text as tokens arrive, without splitting multi-byte characters, and stop strings."""

from __future__ import annotations

REPLACEMENT = "\ufffd"
# ids held back for an incomplete character before they are released as they decode (U+FFFD included): a UTF-8
# character spans at most 4 byte tokens, so more is a model emitting invalid bytes, whose text would otherwise
# wait for the end of the request while every step re-decoded an ever longer window
MAX_HELD_IDS = 8
CONTEXT_IDS = 5                     # prompt ids a decoder starts from (as vLLM's incremental detokenizer)


class IncrementalDecoder:
    """Decodes a growing id list piece by piece.

    Decoding a window of recent ids (from prefix_offset) keeps context-dependent decoders (leading
    spaces) right; a piece ending in U+FFFD is an incomplete UTF-8 sequence and waits for more ids.
    """

    def __init__(self, tokenizer, context: list[int] = ()):
        """context: the ids before the first one pushed (the prompt), whose text is not returned: decoded with
        them, the first piece keeps what only context shows (SentencePiece decoders strip a text's leading space:
        " world" after "Hello" would come out "world"). Left out where it ends inside a character."""
        self.tokenizer = tokenizer
        context = list(context)[-CONTEXT_IDS:]
        if context and self._decode(context).endswith(REPLACEMENT):
            context = []
        self.ids: list[int] = context
        self.prefix_offset = 0
        self.read_offset = len(context)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, new_ids: list[int]) -> str:
        # one id at a time, so the text is the same however the ids arrive (several a step when speculating,
        # one at a time alone): where a run of invalid bytes is released depends on the ids only (~1 us a decode)
        return "".join(self._push_one(i) for i in new_ids)

    def _push_one(self, new_id: int) -> str:
        self.ids.append(new_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        complete = not full.endswith(REPLACEMENT) or len(self.ids) - self.read_offset > MAX_HELD_IDS
        if len(full) > len(prefix) and complete and full.startswith(prefix):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):] if full.startswith(prefix) else ""


class StopStrings:
    """Accumulates text; releases only what cannot be the start of a stop string."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.released = 0
        self.stopped = False

    def push(self, piece: str) -> str:
        search_from = max(0, len(self.text) - self.hold)
        self.text += piece
        hits = [i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self._release(len(self.text))
        return self._release(len(self.text) - self.hold)

    def flush(self) -> str:
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self.released)
        piece = self.text[self.released:upto]
        self.released = upto
        return piece


def partial_tag(text: str, tag: str, since: int = 0) -> int:
    """How many characters at the end of text[since:] may be the start of `tag` (held back while streaming)."""
    return next((n for n in range(min(len(tag) - 1, len(text) - since), 0, -1) if text.endswith(tag[:n])), 0)
