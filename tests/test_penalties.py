"""Repetition penalties (presence, frequency: OpenAI's; repetition: multiplicative) and logit_bias: the target-only
output equals a one-token-at-a-time reference that penalises by hand; speculative output equals the target-only
output for every drafter and policy, under a grammar too and batched; bad values are clear errors; the server takes
them."""

import numpy as np
import pytest
from conftest import together

from specedge.errors import OptionError
from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor

PENALTIES = [dict(frequency_penalty=1.5), dict(presence_penalty=2.0, frequency_penalty=-0.5),
             dict(repetition_penalty=1.8), dict(repetition_penalty=0.7, presence_penalty=0.3)]
PROMPTS = ["the cat sat on the", "aaaa", "def f(x):"]


@pytest.fixture(scope="module")
def gen(good_bundle):
    return load(good_bundle)


def _by_hand(gen, prompt: list[int], n: int, presence=0.0, frequency=0.0, repetition=1.0) -> list[int]:
    """Greedy decoding one token at a time, each step's logits penalised from scratch (vLLM's order)."""
    cursor, out, logits = SlotCursor(gen.target), [], None
    logits = cursor.feed(prompt)[-1].astype(np.float64)
    for _ in range(n):
        counts = np.bincount(out, minlength=logits.size)[:logits.size] if out else np.zeros(logits.size)
        seen = set(prompt) | set(out)
        row = logits.copy()
        for t in seen:
            if t < row.size and repetition != 1.0:
                row[t] = row[t] / repetition if row[t] > 0 else row[t] * repetition
        row -= frequency * counts + presence * (counts > 0)
        token = int(row.argmax())
        out.append(token)
        if token in gen.eos_ids:
            break
        logits = cursor.feed([token])[-1].astype(np.float64)
    return out


@pytest.mark.parametrize("penalties", PENALTIES)
def test_target_only_penalties_are_the_one_token_at_a_time_reference(gen, penalties):
    names = {"presence_penalty": "presence", "frequency_penalty": "frequency", "repetition_penalty": "repetition"}
    for prompt in PROMPTS:
        ids = gen.encode(prompt)
        got = gen.generate_ids(ids, max_new_tokens=40, k=0, **penalties).tokens
        assert got == _by_hand(gen, ids, 40, **{names[k]: v for k, v in penalties.items()})


@pytest.mark.parametrize("penalties", PENALTIES)
@pytest.mark.parametrize("options", [dict(k=4), dict(k=8), dict(policy="adaptive"), dict(k=4, drafter="ngram"),
                                     dict(k=4, drafter="hybrid")])
def test_speculation_under_penalties_is_the_targets_own(gen, penalties, options):
    for prompt in PROMPTS:
        base = gen.generate(prompt, max_new_tokens=48, k=0, **penalties)
        assert gen.generate(prompt, max_new_tokens=48, **penalties, **options).tokens == base.tokens


def test_penalties_under_a_grammar_and_in_a_batch(standard_bundles):
    gen = load(standard_bundles["qwen2"], max_batch=4)
    fmt = {"type": "json_object"}
    requests = [("the cat", dict(max_new_tokens=40, k=4, frequency_penalty=1.0)),
                ("aaaa", dict(max_new_tokens=40, k=4, repetition_penalty=1.5, response_format=fmt)),
                ("x", dict(max_new_tokens=40, k=4)),
                ("def", dict(max_new_tokens=40, k=4, presence_penalty=1.0, response_format=fmt))]
    alone = [gen.generate(p, **o).tokens for p, o in requests]
    assert [r.tokens for r in together(gen, requests)] == alone
    assert alone[1] == gen.generate("aaaa", max_new_tokens=40, k=0, repetition_penalty=1.5, response_format=fmt).tokens


def test_bad_penalties_are_option_errors(gen):
    for bad, match in [(dict(presence_penalty=2.5), "presence_penalty must be in"),
                       (dict(frequency_penalty="1"), "frequency_penalty must be a finite number"),
                       (dict(repetition_penalty=0), r"repetition_penalty must be in \(0")]:
        with pytest.raises(OptionError, match=match):
            gen.generate("x", max_new_tokens=2, **bad)


def test_the_server_takes_penalties(workdir):
    from serve_helpers import MODEL, running, serve_bundle
    from test_serve import client

    with running(serve_bundle(workdir)) as (srv, gen):
        r = client(srv).completions.create(model=MODEL, prompt="the cat", max_tokens=30, temperature=0,
                                           frequency_penalty=1.2, presence_penalty=0.4, logit_bias={"65": 2.5},
                                           extra_body={"repetition_penalty": 1.3})
        alone = gen.generate("the cat", max_new_tokens=30, frequency_penalty=1.2, presence_penalty=0.4,
                             repetition_penalty=1.3, logit_bias={65: 2.5})
        assert r.choices[0].text == alone.text
        assert alone.tokens != gen.generate("the cat", max_new_tokens=30).tokens       # the penalties did something


def test_logit_bias_steers_like_openais_and_speculation_keeps_it_exact(gen):
    """+100 on a token makes greedy output that token; -100 bans one; speculation under a bias is the target's own."""
    plain = gen.generate("the cat", max_new_tokens=20, k=0)
    banned = plain.tokens[0]
    steered = gen.generate("the cat", max_new_tokens=20, k=0, logit_bias={banned: -100, "65": 3.5})
    assert banned not in steered.tokens
    spec = gen.generate("the cat", max_new_tokens=20, k=4, logit_bias={banned: -100, "65": 3.5})
    assert spec.tokens == steered.tokens
    assert set(gen.generate("x", max_new_tokens=5, k=4, logit_bias={"66": 100}, ignore_eos=True).tokens) == {66}
    for bad, match in [({"x": 1}, "logit_bias keys must be token ids"), ({5: 101}, r"logit_bias\[5\] must be in"),
                       ({10**6: 1}, "outside the vocabulary")]:
        with pytest.raises(OptionError, match=match):
            gen.generate("x", max_new_tokens=2, logit_bias=bad)
