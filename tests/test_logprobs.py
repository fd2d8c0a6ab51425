"""Logprobs: each generated token's log probability under the target (and its likeliest rivals), the same with
and without speculation, alone or in a batch, and in OpenAI's shapes from the server."""

import math

import numpy as np
import openai
import pytest

from conftest import together
from serve_helpers import MODEL, running, serve_bundle
from specedge.errors import OptionError
from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.logprobs import token_logprobs
from specedge.serve.logprobs import TokenText, completion_logprobs

PROMPT = "def fib(n):"
OPTIONS = dict(max_new_tokens=24, ignore_eos=True, logprobs=3)


def _reference(gen, prompt_ids: list[int], tokens: list[int]) -> np.ndarray:
    """The target's log-softmax rows for each generated token, fed one call at a time in a fresh slot."""
    cursor = SlotCursor(gen.target, slot=gen.max_batch - 1)
    rows = [cursor.feed(prompt_ids, last=1)[-1].copy()]          # the backend reuses its output buffer
    for token in tokens[:-1]:
        rows.append(cursor.feed([token], last=1)[-1].copy())
    x = np.asarray(rows, dtype=np.float64)
    return x - (x.max(axis=1, keepdims=True) + np.log(np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1,
                                                                                                   keepdims=True)))


@pytest.fixture(scope="module")
def bundle(workdir):
    return serve_bundle(workdir)


def test_speculation_leaves_logprobs_unchanged(bundle):
    gen = load(bundle, prompt_cache=False)
    alone = gen.generate(PROMPT, **OPTIONS, use_draft=False)
    drafted = gen.generate(PROMPT, **OPTIONS, k=4)
    assert drafted.stats.n_accepted > 0
    assert drafted.tokens == alone.tokens and drafted.logprobs == alone.logprobs      # bit for bit
    assert [e.token for e in drafted.logprobs] == drafted.tokens
    gen.close()


def test_token_logprobs_are_a_float64_log_softmax_bit_for_bit():
    """The picked and top values equal a float64 log-softmax of the whole rows exactly; ties at the top's cut keep the
    lower ids (an argpartition would pick any of them)."""
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((6, 5000)) * 4).astype(np.float32)
    logits[2, :] = 0.0                                     # a flat row: every token ties
    logits[3, [7, 11, 400, 4999]] = logits[3].max() + 1    # four tied for first
    tokens = [int(t) for t in rng.integers(0, 5000, 6)]
    x = logits.astype(np.float64)
    logp = x - (x.max(axis=1, keepdims=True) + np.log(np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1,
                                                                                                   keepdims=True)))
    entries = token_logprobs(logits, tokens, 3)
    for row, token, entry in zip(logp, tokens, entries):
        assert entry.logprob == row[token]
        assert [t for t, _ in entry.top] == sorted(range(row.size), key=lambda i: (-row[i], i))[:3]
        assert [lp for _, lp in entry.top] == [row[t] for t, _ in entry.top]
    assert [t for t, _ in entries[2].top] == [0, 1, 2] and [t for t, _ in entries[3].top] == [7, 11, 400]
    assert [e.top for e in token_logprobs(logits[:2], tokens[:2], 0)] == [(), ()]
    assert len(token_logprobs(logits[:1, :2], [1], 5)[0].top) == 2            # top beyond the vocabulary: all of it


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_p": 0.9, "seed": 4}], ids=["greedy", "sampled"])
def test_logprobs_are_the_target_s_log_softmax(bundle, sampling):
    gen = load(bundle, max_batch=2, prompt_cache=False)
    prompt_ids = gen.encode(PROMPT)
    result = gen.generate_ids(prompt_ids, **OPTIONS, **sampling, k=3)
    expected = _reference(gen, prompt_ids, result.tokens)
    for entry, row in zip(result.logprobs, expected):
        assert math.isclose(entry.logprob, row[entry.token], rel_tol=0, abs_tol=1e-9)
        assert [t for t, _ in entry.top] == sorted(range(row.size), key=lambda i: (-row[i], i))[:3]
        assert all(math.isclose(lp, row[t], abs_tol=1e-9) for t, lp in entry.top)
    if not sampling:                                       # greedy: the chosen token is the likeliest
        assert all(e.token == e.top[0][0] for e in result.logprobs)
    assert len(result.logprobs) == len(result.tokens)
    gen.close()


def test_logprobs_in_a_batch_equal_their_solo_runs(bundle):
    gen = load(bundle, max_batch=3, prompt_cache=False)
    requests = [(PROMPT, dict(OPTIONS, k=2)), ("class A:\n", dict(OPTIONS, logprobs=None)),
                ("import os\n", dict(OPTIONS, logprobs=0, temperature=0.7, seed=1))]
    solo = [gen.generate(p, **o) for p, o in requests]
    batched = together(gen, requests)
    assert [r.logprobs for r in batched] == [r.logprobs for r in solo]
    assert batched[1].logprobs is None and all(e.top == () for e in batched[2].logprobs)
    gen.close()


def test_logprobs_stop_where_the_tokens_stop(bundle):
    gen = load(bundle)
    result = gen.generate(PROMPT, max_new_tokens=7, logprobs=1, k=4)
    assert len(result.logprobs) == len(result.tokens) == 7
    assert "logprobs" in result.to_json() and len(result.to_json()["logprobs"]) == 7
    gen.close()


@pytest.mark.parametrize("value", [-1, 21, "3", 2.0, True])
def test_bad_logprobs_are_option_errors(bundle, value):
    gen = load(bundle)
    with pytest.raises(OptionError, match="logprobs"):
        gen.generate(PROMPT, logprobs=value)
    gen.close()


def test_token_bytes_are_the_bytes_the_tokens_stand_for(bundle):
    from specedge.serve.logprobs import TokenText

    gen = load(bundle)
    texts = TokenText(gen.tokenizer)
    for text in ("def fib(n):", "héllo wörld €5", "日本"):
        ids = gen.tokenizer.encode(text, add_special_tokens=False).ids
        assert b"".join(bytes(texts(i)[1]) for i in ids) == text.encode("utf-8")
    special = gen.tokenizer.token_to_id("<|im_end|>")
    assert texts(special) == ("<|im_end|>", list(b"<|im_end|>"))
    gen.close()


def test_text_offsets_index_the_text_across_split_characters_and_special_tokens(bundle):
    from specedge.runtime.logprobs import TokenLogprob
    from specedge.serve.logprobs import TextOffsets, TokenText

    gen = load(bundle)
    texts = TokenText(gen.tokenizer)
    end = gen.tokenizer.token_to_id("<|im_end|>")
    ids = gen.tokenizer.encode("x = 𝔘 + é", add_special_tokens=False).ids
    ids = ids[:4] + [end] + ids[4:]                         # a special token, left out of the text, mid-way
    text = gen.tokenizer.decode(ids, skip_special_tokens=True)
    block = completion_logprobs([TokenLogprob(i, -1.0) for i in ids], TextOffsets(texts))
    assert text == "x = 𝔘 + é"
    assert block["text_offset"] == [0, 1, 2, 3, 4, 4, 4, 4, 4, 5, 6, 7, 8, 8]
    assert block["tokens"][5:9] == ["bytes:\\xf0", "bytes:\\x9d", "bytes:\\x94", "bytes:\\x98"]
    assert block["tokens"][4] == "<|im_end|>"
    assert [list(top) for top in block["top_logprobs"]] == [[t] for t in block["tokens"]]
    gen.close()


def test_a_stop_string_ends_the_tokens_where_it_ends_whatever_a_step_committed(bundle):
    gen = load(bundle, prompt_cache=False)
    free = gen.generate(PROMPT, max_new_tokens=30, ignore_eos=True, use_draft=False)
    stop = free.text[5:7]                                   # a stop string the greedy text reaches
    alone = gen.generate(PROMPT, max_new_tokens=30, ignore_eos=True, use_draft=False, stop=stop, logprobs=0)
    drafted = gen.generate(PROMPT, max_new_tokens=30, ignore_eos=True, k=6, stop=stop, logprobs=0)
    assert alone.stats.stop_reason == drafted.stats.stop_reason == "stop_string" and stop not in drafted.text
    assert drafted.tokens == alone.tokens and drafted.logprobs == alone.logprobs and drafted.text == alone.text
    assert len(alone.tokens) < 30 and drafted.stats.new_tokens == len(drafted.tokens)
    gen.close()


# -- the server ----------------------------------------------------------------------------------------------------
def test_prompt_logprobs_score_every_prompt_token_after_the_first(bundle):
    """prompt_logprobs (scoring, as lm-evaluation-harness asks for with echo): row i of the prefill predicts prompt
    token i + 1, across prefill chunks (64 tokens); the prompt cache is not used for it (its logits are needed)."""
    gen = load(bundle, max_batch=2)
    prompt_ids = gen.encode("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 3)
    assert len(prompt_ids) > 64
    cursor = SlotCursor(gen.target, slot=1)
    rows = np.concatenate([cursor.feed(prompt_ids[at: at + 10]).copy() for at in range(0, len(prompt_ids), 10)])
    x = rows.astype(np.float64)
    expected = x - (x.max(axis=1, keepdims=True) + np.log(np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1,
                                                                                                       keepdims=True)))
    for attempt in range(2):                              # the second: the same prompt the cache would hold
        result = gen.generate_ids(prompt_ids, max_new_tokens=2, prompt_logprobs=2, k=3)
        assert [e.token for e in result.prompt_logprobs] == prompt_ids[1:]
        for entry, row in zip(result.prompt_logprobs, expected[:-1]):
            assert math.isclose(entry.logprob, row[entry.token], abs_tol=1e-4)
            assert [t for t, _ in entry.top] == sorted(range(row.size), key=lambda i: (-row[i], i))[:2]
        assert result.stats.cached_prompt_tokens == 0
    plain = gen.generate_ids(prompt_ids, max_new_tokens=2, k=3)
    assert plain.prompt_logprobs is None and plain.tokens == result.tokens
    assert "prompt_logprobs" in result.to_json() and "prompt_logprobs" not in plain.to_json()
    with pytest.raises(OptionError, match="prompt_logprobs"):
        gen.generate_ids(prompt_ids, prompt_logprobs=21)
    gen.close()


@pytest.fixture(scope="module")
def server(bundle):
    with running(bundle, max_batch=2) as (srv, gen):
        yield srv, gen


def _client(srv):
    return openai.OpenAI(base_url=srv.url, api_key="-", max_retries=0)


def test_completion_logprobs_in_the_legacy_shape(server):
    srv, gen = server
    c = _client(srv)
    common = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    out = c.completions.create(**common)
    block = out.choices[0].logprobs
    expected = gen.generate(PROMPT, max_new_tokens=12, ignore_eos=True, logprobs=2, use_draft=False)
    assert block.token_logprobs == [e.logprob for e in expected.logprobs]
    texts = TokenText(gen.tokenizer)
    assert block.tokens == [texts(e.token)[0] for e in expected.logprobs]
    # the alternatives asked for and the chosen token (greedy: it is the likeliest of them)
    for top, token, lp in zip(block.top_logprobs, block.tokens, block.token_logprobs):
        assert 1 <= len(top) <= 3 and top[token] == lp == max(top.values())
    text = out.choices[0].text
    for token, at in zip(block.tokens, block.text_offset):
        if not token.startswith("bytes:"):
            assert text[at: at + len(token)] == token
    chunks = list(c.completions.create(**common, stream=True))
    streamed = [lp for ch in chunks if ch.choices and ch.choices[0].logprobs
                for lp in ch.choices[0].logprobs.token_logprobs]
    offsets = [o for ch in chunks if ch.choices and ch.choices[0].logprobs for o in ch.choices[0].logprobs.text_offset]
    assert streamed == block.token_logprobs and offsets == block.text_offset


def test_echo_with_logprobs_scores_the_prompt_as_lm_evaluation_harness_asks(server):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, max_tokens 1, temperature 0; it reads
    token_logprobs[context:-1]. The prompt's first token has none (null), each other token the target's own."""
    srv, gen = server
    c = _client(srv)
    prompt = "def add(a, b):\n    return a + b\n"
    out = c.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=1, temperature=0)
    choice, prompt_ids = out.choices[0], gen.encode(prompt)
    block = choice.logprobs
    expected = gen.generate_ids(prompt_ids, max_new_tokens=1, prompt_logprobs=1, logprobs=1)
    texts = TokenText(gen.tokenizer)
    assert choice.text == gen.tokenizer.decode(prompt_ids, skip_special_tokens=True) + expected.text
    assert block.tokens == [texts(t)[0] for t in prompt_ids + expected.tokens]
    assert block.token_logprobs == [None] + [e.logprob for e in expected.prompt_logprobs + expected.logprobs]
    assert block.top_logprobs[0] is None and all(len(top) in (1, 2) for top in block.top_logprobs[1:])
    for token, at in zip(block.tokens, block.text_offset):
        assert choice.text[at: at + len(token)] == token
    assert out.usage.prompt_tokens == len(prompt_ids) and out.usage.completion_tokens == 1
    plain = c.completions.create(model=MODEL, prompt=prompt, echo=True, max_tokens=3, temperature=0)
    assert plain.choices[0].text.startswith(prompt) and plain.choices[0].logprobs is None
    only = c.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=0)   # as vLLM allows
    assert only.choices[0].text == gen.tokenizer.decode(prompt_ids, skip_special_tokens=True)
    assert only.choices[0].logprobs.token_logprobs == block.token_logprobs[:-1] and only.usage.completion_tokens == 0
    # streamed: the prompt (and its block) comes with the first chunk, the whole equals the unstreamed response
    for asked, whole in [(dict(logprobs=1, max_tokens=1), out), (dict(max_tokens=3), plain), (dict(logprobs=1,
                                                                                                  max_tokens=0), only)]:
        chunks = list(c.completions.create(model=MODEL, prompt=prompt, echo=True, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, **asked))
        texts = [ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].text]
        assert "".join(texts) == whole.choices[0].text and texts[0].startswith(prompt)
        blocks = [ch.choices[0].logprobs for ch in chunks if ch.choices and ch.choices[0].logprobs]
        if whole.choices[0].logprobs is None:
            assert blocks == []
        else:
            assert len(blocks[0].tokens) >= len(prompt_ids)
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                assert [v for b in blocks for v in getattr(b, key)] == getattr(whole.choices[0].logprobs, key)
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.completions.create(model=MODEL, prompt=prompt, max_tokens=0)              # without echo: nothing to do


def test_chat_logprobs_in_openai_s_shape(server):
    srv, gen = server
    c = _client(srv)
    common = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=0,
                  logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    out = c.chat.completions.create(**common)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 10
    expected = gen.generate("hi", chat=True, max_new_tokens=10, ignore_eos=True, logprobs=3, use_draft=False)
    for entry, e in zip(content, expected.logprobs):
        assert entry.logprob == e.logprob
        assert len(entry.bytes) == 1                        # every token of this vocabulary is one byte
        byte = entry.bytes[0]
        assert entry.token == (bytes([byte]).decode() if byte < 128 else f"bytes:\\x{byte:02x}")
        assert [t.logprob for t in entry.top_logprobs] == [lp for _, lp in e.top]
    streamed = [e for ch in c.chat.completions.create(**common, stream=True) if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in content]
    plain = c.chat.completions.create(**{**common, "logprobs": None, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_a_stream_carries_the_logprobs_of_what_it_has_received(bundle):
    gen = load(bundle)
    stream = gen.stream(PROMPT, **OPTIONS, k=3)
    seen = []
    for _ in stream:
        assert len(stream.logprobs) == len(stream.tokens)
        seen.append(len(stream.logprobs))
    assert stream.logprobs == stream.result.logprobs and seen
    gen.close()
