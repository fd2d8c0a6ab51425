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


def test_the_first_piece_is_decoded_after_the_prompt(tmp_path):
    """SentencePiece decoders (Llama 2, Mistral) strip a text's leading space: decoded alone, " world" after the
    prompt "hello" came out "world". Decoded after the prompt's last ids it keeps the space; a prompt ending inside
    a character is no context (its bytes would be counted into the reply's first character)."""
    from tokenizers import decoders, models

    spm = Tokenizer(models.WordLevel({"▁hello": 0, "▁world": 1, "<unk>": 2}, unk_token="<unk>"))
    spm.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    assert spm.decode([1]) == "world" and spm.decode([0, 1]) == "hello world"
    after = IncrementalDecoder(spm, context=[0])
    assert after.push([1, 1]) + after.flush() == " world world"
    alone = IncrementalDecoder(spm)
    assert alone.push([1, 1]) + alone.flush() == "world world"
    tok = _tokenizer(tmp_path)
    ids = tok.encode("café!").ids
    split = IncrementalDecoder(tok, context=ids[:-2])             # ends inside "é"
    assert split.ids == [] and split.push(ids[-2:]) + split.flush() == tok.decode(ids[-2:])
    whole = IncrementalDecoder(tok, context=tok.encode("naïve ").ids)
    assert whole.push(ids) + whole.flush() == "café!"
