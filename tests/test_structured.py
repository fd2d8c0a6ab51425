"""Structured output (response_format): speculation under a grammar is exact. Greedy output equals the target's own
under the same grammar for every drafter and policy, alone and batched; seeded sampling under a grammar is
distributed exactly like target sampling under it (the exact distribution enumerated over the grammar's texts);
what comes out parses and satisfies the schema; bad formats are clear errors; the server honours it."""

import json

import numpy as np
import pytest
from conftest import together
from scipy import stats

from specedge.errors import OptionError
from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.grammar import _compiled, grammar_of, masked
from specedge.runtime.penalties import Penalties
from specedge.runtime.sampling import Warp

NO_SPACE = {"x-guidance": {"whitespace_flexible": False}}      # the tiny models would otherwise wander in spaces
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False, **NO_SPACE}
FORMATS = {"schema": {"type": "json_schema", "json_schema": {"name": "ab", "schema": SCHEMA}},
           "object": {"type": "json_object"}}
PROMPTS = ["the cat", "def f(x):", "{{{"]


@pytest.fixture(scope="module")
def gen(good_bundle):
    return load(good_bundle)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("options", [dict(k=4), dict(k=8), dict(policy="adaptive"), dict(k=4, drafter="ngram"),
                                     dict(k=4, drafter="hybrid")])
def test_greedy_output_under_a_grammar_is_the_targets_own(gen, fmt, options):
    for prompt in PROMPTS:
        base = gen.generate(prompt, max_new_tokens=48, k=0, response_format=FORMATS[fmt])
        spec = gen.generate(prompt, max_new_tokens=48, response_format=FORMATS[fmt], **options)
        assert spec.tokens == base.tokens
        if fmt == "schema":
            value = json.loads(spec.text)
            assert set(value) == {"a", "b"} and 0 <= value["a"] <= 99 and isinstance(value["b"], bool)
            assert spec.stats.stop_reason == "eos"


def test_an_object_s_properties_come_in_the_schema_s_order(gen):
    """As OpenAI's structured outputs: a model asked for {"name", "arguments"} writes "name" first (a forced tool
    call); the schema's keys are not sorted on the way to the grammar."""
    backwards = {**SCHEMA, "properties": {"b": SCHEMA["properties"]["b"], "a": SCHEMA["properties"]["a"]}}
    for schema, first in [(SCHEMA, '{"a":'), (backwards, '{"b":')]:
        fmt = {"type": "json_schema", "json_schema": {"name": "ab", "schema": schema}}
        assert gen.generate("the cat", max_new_tokens=48, k=4, response_format=fmt).text.startswith(first)


def test_a_first_grammar_s_setup_is_not_in_the_request_s_time(good_bundle, monkeypatch):
    """Building the vocabulary's view for the grammar library (about a second on a 150k vocabulary) happens before
    the request's clock starts: the first structured request's tok/s is not a setup's."""
    import time

    gen = load(good_bundle)
    build = type(gen).grammar_tokens

    def slow(self):
        time.sleep(2.0)                  # a setup far longer than the tiny model's whole request
        return build(self)

    monkeypatch.setattr(type(gen), "grammar_tokens", slow)
    result = gen.generate("the cat", max_new_tokens=8, k=4, response_format=FORMATS["object"])
    assert result.stats.total_s < 2.0


def test_rows_under_grammars_in_a_batch_equal_their_solo_runs(standard_bundles):
    gen = load(standard_bundles["qwen2"], max_batch=4)
    requests = [(p, dict(max_new_tokens=40, k=4, **({"response_format": FORMATS[f]} if f else {})))
                for p, f in zip(PROMPTS + ["x"], ["schema", None, "object", "schema"])]
    alone = [gen.generate(p, **o).tokens for p, o in requests]
    assert [r.tokens for r in together(gen, requests)] == alone


@pytest.mark.parametrize("penalties", [{}, dict(frequency_penalty=1.5, repetition_penalty=1.3)])
def test_sampling_under_a_grammar_is_distributed_like_the_targets_own(gen, penalties):
    """The grammar allows five strings; their exact probabilities under the target (each step's warped distribution
    over the allowed tokens, renormalised; with penalties, penalised for the text before it) against 800 seeded
    speculative samples (k = 4)."""
    schema = {"enum": ["ab", "ba", "abba", "b", "aab"], **NO_SPACE}
    fmt = {"type": "json_schema", "json_schema": {"name": "e", "schema": schema}}
    warp, prompt = Warp(1.0, 0, 1.0), gen.encode("x")
    by_hand = Penalties(penalties.get("presence_penalty", 0.0), penalties.get("frequency_penalty", 0.0),
                        penalties.get("repetition_penalty", 1.0))
    exact = {}

    def walk(constraint, text: list[int], p: float):
        allowed = constraint.allowed()
        logits = by_hand.apply(SlotCursor(gen.target).feed(prompt + text)[-1:], prompt, text, [])
        probs = warp.probs(masked(logits, [allowed]))[0]
        for token in np.flatnonzero(probs > 0):
            if token in gen.eos_ids:
                exact[gen.decode(text)] = exact.get(gen.decode(text), 0.0) + p * probs[token]
                continue
            constraint.push(int(token))
            walk(constraint, text + [int(token)], p * probs[token])
            constraint.pop(1)

    walk(gen._constraint(gen.options(response_format=fmt)), [], 1.0)
    assert sorted(exact) == sorted(json.dumps(s) for s in schema["enum"]) and abs(sum(exact.values()) - 1) < 1e-6
    n, counts = 800, dict.fromkeys(exact, 0)
    for seed in range(n):
        counts[gen.generate("x", max_new_tokens=12, temperature=1.0, seed=seed, k=4, response_format=fmt,
                            **penalties).text] += 1
    cells = [t for t in exact if exact[t] * n >= 5]
    observed = [counts[t] for t in cells] + [n - sum(counts[t] for t in cells)]
    expected = [exact[t] * n for t in cells] + [n - sum(exact[t] * n for t in cells)]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_bad_formats_are_option_errors_naming_them(gen, monkeypatch):
    for bad, match in [("json", "response_format must be"), ({"type": "xml"}, "not supported"),
                       ({"type": "json_schema"}, "needs"),
                       ({"type": "json_schema", "json_schema": {"schema": 3}}, "needs"),
                       ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "not usable")]:
        with pytest.raises(OptionError, match=match):
            gen.generate("x", max_new_tokens=2, response_format=bad)
    assert grammar_of({"type": "text"}) is None and grammar_of(None) is None
    monkeypatch.setitem(__import__("sys").modules, "llguidance", None)       # not installed
    _compiled.cache_clear()
    with pytest.raises(OptionError, match=r"pip install 'specedge\[structured\]'"):
        grammar_of({"type": "json_object"})


def test_the_server_honours_response_format(workdir):
    from serve_helpers import MODEL, running, serve_bundle
    from test_serve import assert_openai_error, client, post

    with running(serve_bundle(workdir)) as (srv, gen):
        c = client(srv)
        messages = [{"role": "user", "content": "hi"}]
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                      response_format=FORMATS["schema"])
        value = json.loads(r.choices[0].message.content)
        assert set(value) == {"a", "b"} and r.choices[0].finish_reason == "stop"
        alone = gen.chat(messages, max_new_tokens=60, response_format=FORMATS["schema"])
        assert r.choices[0].message.content == alone.text
        streamed = "".join(part.choices[0].delta.content or "" for part in c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=60, temperature=0, response_format=FORMATS["schema"],
            stream=True) if part.choices)
        assert streamed == alone.text
        chat = {"model": MODEL, "messages": messages, "max_tokens": 2}
        for bad in [{"type": "xml"}, {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}]:
            bad_request = post(srv, "/chat/completions", {**chat, "response_format": bad})
            assert_openai_error(bad_request, 400, "response_format")
        ok = post(srv, "/completions", {"model": MODEL, "prompt": "x", "max_tokens": 60, "temperature": 0,
                                        "response_format": {"type": "json_object"}})   # greedy: not a draw that
                                                                                        # runs out in whitespace
        assert ok.status_code == 200, ok.text
        json.loads(ok.json()["choices"][0]["text"])


def test_generate_takes_a_response_format_from_the_command_line(good_bundle, tmp_path, capsys):
    from specedge.cli import main

    schema = tmp_path / "ab.json"
    schema.write_text(json.dumps(SCHEMA))
    for fmt in ("json", str(schema)):
        assert main(["generate", str(good_bundle), "--prompt", "the cat", "--response-format", fmt, "--json",
                     "--max-new-tokens", "48"]) == 0
        value = json.loads(json.loads(capsys.readouterr().out)["text"])
        assert isinstance(value, dict) and (fmt == "json" or set(value) == {"a", "b"})
    assert main(["generate", str(good_bundle), "--prompt", "x", "--response-format", str(tmp_path / "none.json")]) == 2
    assert "--response-format: not 'json' and not a readable JSON schema file" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1, 2]")
    assert main(["generate", str(good_bundle), "--prompt", "x", "--response-format", str(tmp_path / "list.json")]) == 2
    err = capsys.readouterr().err
    assert "list.json: a JSON schema is an object, got list" in err and "json_schema" not in err


def test_a_grammar_ends_at_a_stop_id_too_and_refuses_what_it_cannot_hold(gen, word_bundle):
    fmt = FORMATS["object"]
    constraint = gen._constraint(gen.options(response_format=fmt, stop_ids=(5,)))
    for token in gen.encode("{}"):
        constraint.consume(token)
    assert set(np.flatnonzero(constraint.allowed())) == set(gen.eos_ids) | {5}     # complete: only an end
    depth = constraint.depth
    constraint.consume(5)
    assert constraint.ended and not constraint.allowed().any()
    constraint.rewind(depth)                                                  # an interrupted step's rewind
    assert not constraint.ended and constraint.allowed()[5]
    with pytest.raises(OptionError, match="ignore_eos cannot be combined with response_format"):
        gen.generate("x", max_new_tokens=4, ignore_eos=True, response_format=fmt)
    words = load(word_bundle)                                                 # w0..w10: no "{" to start with
    with pytest.raises(OptionError, match="this vocabulary cannot write the grammar's text"):
        words.generate_ids([1, 2], max_new_tokens=4, response_format=fmt)
