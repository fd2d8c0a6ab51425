"""Streaming text: multi-byte characters are never split; stop strings are honoured across pieces."""

from tokenizers import Tokenizer

import tiny_models as tm
from specedge.runtime.text import IncrementalDecoder, StopStrings


def _tokenizer(tmp_path):
    tm.byte_tokenizer().save_pretrained(tmp_path)
    return Tokenizer.from_file(str(tmp_path / "tokenizer.json"))


def test_incremental_decoding_keeps_multibyte_characters_whole(tmp_path):
    tok = _tokenizer(tmp_path)
    text = "naïve café — 日本語 ✓ 🙂 done"
    ids = tok.encode(text).ids
    assert len(ids) > len(text)                       # byte-level: multi-byte characters span tokens
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push([i]) for i in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert sum(1 for p in pieces if p) < len(ids)     # some ids produced no text until their character completed


def test_incremental_decoding_in_uneven_chunks(tmp_path):
    tok = _tokenizer(tmp_path)
    text = "añb🙂c"
    ids = tok.encode(text).ids
    decoder = IncrementalDecoder(tok)
    out = decoder.push(ids[:2]) + decoder.push(ids[2:5]) + decoder.push(ids[5:]) + decoder.flush()
    assert out == text


def test_stop_strings_across_pieces():
    stops = StopStrings(["\n\n", "END"])
    released = "".join(stops.push(p) for p in ["abc", "E", "N", "xy\n", "\nmore"])
    assert stops.stopped
    assert released == stops.text == "abcENxy"


def test_stop_strings_release_everything_without_stop():
    stops = StopStrings(["STOP"])
    released = "".join(stops.push(p) for p in ["ST", "O", "x", "yz"]) + stops.flush()
    assert not stops.stopped and released == "STOxyz"


def test_a_run_of_invalid_bytes_is_released_not_held_to_the_end(tmp_path):
    """A model emitting bytes that never complete a character: the text comes out as it goes (with U+FFFD), and
    the window decoded each step stays short."""
    tok = _tokenizer(tmp_path)
    bad = tok.encode("é").ids[1]                      # a lone UTF-8 continuation byte
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push([bad]) for _ in range(40)]
    assert sum(1 for p in pieces if p) >= 4           # released every few ids, not only at the end
    assert len(decoder.ids) - decoder.prefix_offset <= 2 * 9      # the window decoded each step stays short
    assert (("".join(pieces) + decoder.flush()).count("\ufffd")) == 40
