"""`specedge serve` end to end: the official openai client against servers started here on ephemeral loopback
ports (tiny models, a few tokens each)."""

import asyncio
import json
import logging
import signal
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from serve_helpers import MODEL, health, running, serve_bundle, serve_process, sse_events, wait_idle  # noqa: E402
from specedge.bench.serve import free_port  # noqa: E402
from specedge.cli import main  # noqa: E402

PROMPT = "def fib(n):"
OTHERS = ["class A:\n", "import os\n", "x" * 70 + " = 1\n"]


@pytest.fixture(scope="module")
def bundle(workdir):
    return serve_bundle(workdir)


@pytest.fixture(scope="module")
def server(bundle):
    with running(bundle, max_batch=4, max_queue=16) as (srv, gen):
        yield srv, gen


def client(srv, **kw):
    return openai.OpenAI(base_url=srv.url, api_key=kw.pop("api_key", "-"), max_retries=0, **kw)


def post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=30, **kw)


def assert_openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def test_models_and_health(server):
    srv, gen = server
    models = client(srv).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client(srv).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client(srv).models.retrieve("gpt-4")
    # a trailing slash is the same route (clients that join paths send it), not a bodiless 307 or a 404
    assert httpx.get(srv.url + "/models/").json()["data"][0]["id"] == MODEL
    assert httpx.get(srv.url + f"/models/{MODEL}/").json()["id"] == MODEL
    assert httpx.get(srv.base + "/health/").json()["status"] == "ok"
    slashed = post(srv, "/completions/", {"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert slashed.status_code == 200 and slashed.json()["object"] == "text_completion", slashed.text
    assert_openai_error(httpx.get(srv.url + "/nowhere/"), 404)
    # an escaped slash is part of a model id, not a trailing slash
    escaped = assert_openai_error(httpx.get(srv.url + f"/models/{MODEL}%2F"), 404, "model")
    assert f"'{MODEL}/'" in escaped["message"]
    state = health(srv)
    cache = state.pop("prompt_cache")
    assert state == {"status": "ok", "model": MODEL, "running": 0, "waiting": 0, "max_batch": 4, "max_queue": 16}
    assert cache["on"] is True and cache["texts"] == gen.scheduler.cache.count()


def test_tokenize_counts_what_the_generating_routes_feed(server):
    srv, gen = server
    base = srv.base
    out = client(srv).completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    got = httpx.post(base + "/tokenize", json={"model": MODEL, "prompt": PROMPT}, timeout=30).json()
    assert got == {"count": out.usage.prompt_tokens, "max_model_len": gen.max_seq_len,
                   "tokens": gen.tokenizer.encode(PROMPT).ids, "token_strs": None}
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    chat = client(srv).chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    rendered = httpx.post(base + "/tokenize", json={"messages": messages, "return_token_strs": True}).json()
    assert rendered["count"] == chat.usage.prompt_tokens == len(rendered["tokens"]) > got["count"]
    assert rendered["token_strs"] == [gen.tokenizer.id_to_token(i) for i in rendered["tokens"]]
    assert httpx.post(base + "/tokenize", json={"prompt": rendered["tokens"]}).json()["tokens"] == rendered["tokens"]
    text = httpx.post(base + "/detokenize", json={"model": MODEL, "tokens": got["tokens"]}).json()
    assert text == {"prompt": PROMPT}
    whole = httpx.post(base + "/detokenize", json={"tokens": rendered["tokens"]}).json()["prompt"]
    assert "be brief" in whole and gen.tokenizer.encode(whole).ids == rendered["tokens"]     # special tokens kept
    assert httpx.post(base + "/tokenize", json={"prompt": ""}).json()["count"] == 0
    explicit = {"messages": messages, "add_special_tokens": False, "add_generation_prompt": True}   # vLLM's defaults
    assert httpx.post(base + "/tokenize", json=explicit).json()["tokens"] == rendered["tokens"]
    assert httpx.post(base + "/tokenize", json={"prompt": PROMPT, "add_special_tokens": True}).json() == got
    for path, body, status, param in [
            ("/tokenize", {"prompt": "x", "messages": messages}, 400, "prompt"),
            ("/tokenize", {}, 400, "prompt"),
            ("/tokenize", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
            ("/tokenize", {"prompt": "x", "add_special_tokens": False}, 400, "add_special_tokens"),
            ("/tokenize", {"messages": messages, "add_special_tokens": True}, 400, "add_special_tokens"),
            ("/tokenize", {"messages": messages, "add_generation_prompt": False}, 400, "add_generation_prompt"),
            ("/tokenize", {"prompt": "x", "add_generation_prompt": True}, 400, "add_generation_prompt"),
            ("/tokenize", {"prompt": "x", "temperature": 0}, 400, "temperature"),
            ("/tokenize", {"prompt": "x", "tools": []}, 400, "prompt"),
            ("/tokenize", {"prompt": [gen.vocab_size]}, 400, "prompt"),
            ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
            ("/tokenize", {"prompt": "x", "return_token_strs": "yes"}, 400, "return_token_strs"),
            ("/tokenize", ["x"], 400, None),
            ("/detokenize", {"tokens": [1, -1]}, 400, "tokens"),
            ("/detokenize", {"tokens": "12"}, 400, "tokens"),
            ("/detokenize", {"tokens": [1.5]}, 400, "tokens")]:
        assert_openai_error(httpx.post(base + path, json=body, timeout=30), status, param)
    assert "'tokens'" in httpx.post(base + "/detokenize", json={"tokens": [1.5]}).json()["error"]["message"]
    assert_openai_error(httpx.get(base + "/tokenize"), 405)
    assert health(srv)["status"] == "ok"


def test_completion_and_chat_match_the_runtime(server):
    srv, gen = server
    c = client(srv)
    out = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    expected = gen.generate(PROMPT, max_new_tokens=24, ignore_eos=True, use_draft=False)
    assert out.choices[0].text == expected.text and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(gen.encode(PROMPT)), 24)
    spec = out.model_extra["speculation"]
    assert spec["policy"] == "adaptive@model" and spec["stop_reason"] == "max_new_tokens"
    assert set(spec) >= {"drafted_tokens", "accepted_tokens", "mean_accepted_length", "acceptance_per_position"}

    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == gen.generate("hi", chat=True, max_new_tokens=16, ignore_eos=True).text
    multi = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
             {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    again = c.chat.completions.create(model=MODEL, messages=multi, max_tokens=8, temperature=0)
    assert again.usage.prompt_tokens > chat.usage.prompt_tokens


def test_a_conversation_s_next_turn_reports_its_cached_prompt_tokens(server):
    """The prompt cache: the next turn of a conversation prefills only what is new, says so in OpenAI's usage shape,
    and answers exactly as a server without the cache does (the runtime with its cache cleared)."""
    srv, gen = server
    c = client(srv)
    wait_idle(srv)
    messages = [{"role": "user", "content": "tell me about caches"}]
    first = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True})
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and then?"}]
    chunks = list(c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens // 2
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    wait_idle(srv)
    gen.clear_prompt_cache()
    fresh = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.choices[0].message.content == text


def test_the_served_name_is_the_bundle_folder_as_typed(tmp_path, monkeypatch):
    """A symlinked bundle is served under the link's name (the name its user chose), "." under the folder's own."""
    from specedge.serve.engine import EngineConfig

    real = tmp_path / "qwen2.5-coder-int4-std"
    real.mkdir()
    (tmp_path / "int4-std").symlink_to(real)
    assert EngineConfig(bundle=str(tmp_path / "int4-std")).model_name == "int4-std"
    assert EngineConfig(bundle=str(tmp_path / "int4-std") + "/").model_name == "int4-std"
    monkeypatch.chdir(real)
    assert EngineConfig(bundle=".").model_name == "qwen2.5-coder-int4-std"
    assert EngineConfig(bundle=".", served_model_name="coder").model_name == "coder"


def test_serve_without_the_prompt_cache(bundle):
    from specedge.serve.engine import EngineConfig, load_engine

    gen, _ = load_engine(EngineConfig(bundle=str(bundle), threads=1, prompt_cache=False))
    try:
        assert gen.prompt_cache is False
    finally:
        gen.close()


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streams_end_with_usage_and_speculation(server, kind):
    srv, gen = server
    c = client(srv)
    common = dict(model=MODEL, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    if kind == "chat":
        messages = [{"role": "user", "content": "hi"}]
        make = lambda **kw: c.chat.completions.create(messages=messages, **common, **kw)  # noqa: E731
        text_of = lambda ch: ch.delta.content or ""  # noqa: E731
        whole = make().choices[0].message.content
    else:
        make = lambda **kw: c.completions.create(prompt=PROMPT, **common, **kw)  # noqa: E731
        text_of = lambda ch: ch.text  # noqa: E731
        whole = make().choices[0].text
    chunks = list(make(stream=True, stream_options={"include_usage": True}))
    assert "".join(text_of(ch.choices[0]) for ch in chunks if ch.choices) == whole
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 20
    assert last.model_extra["speculation"]["stop_reason"] == "max_new_tokens"
    plain = list(make(stream=True))                       # without include_usage the finish chunk carries the stats
    assert plain[-1].choices[0].finish_reason == "length" and "speculation" in plain[-1].model_extra
    assert all(ch.usage is None for ch in plain)


def test_stop_strings(server):
    srv, gen = server
    full = gen.generate(PROMPT, max_new_tokens=40, ignore_eos=True).text
    stop = full[6:9]
    cut = full[: full.index(stop)]
    out = client(srv).completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop],
                                         extra_body={"ignore_eos": True})
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    assert out.model_extra["speculation"]["stop_reason"] == "stop_string"
    streamed = client(srv).completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                              stream=True, extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].text for ch in streamed) == cut


def test_a_seed_reproduces_a_sampled_output(server):
    """Under a fixed policy (adaptive's k follows the load, and with it which random numbers go where)."""
    srv, gen = server
    c = client(srv)
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0.9, seed=7,
              extra_body={"speculation": {"policy": "fixed:3"}, "ignore_eos": True})
    first, second = c.completions.create(**kw), c.completions.create(**kw)
    assert first.choices[0].text == second.choices[0].text
    expected = gen.generate(PROMPT, max_new_tokens=24, temperature=0.9, seed=7, policy="fixed:3", ignore_eos=True)
    assert first.choices[0].text == expected.text
    other = c.completions.create(**{**kw, "seed": 8})
    assert other.choices[0].text != first.choices[0].text


def test_n_choices_are_sequences_of_their_own_seeded_seed_plus_index(server):
    """'n': choice i of a seeded request is the n = 1 request with seed + i (pass@k evaluations draw several samples
    a prompt); greedy choices are all the target's one output; usage counts the prompt once."""
    srv, gen = server
    c = client(srv)
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.9, seed=11,
              extra_body={"speculation": {"policy": "fixed:3"}, "ignore_eos": True})
    many = c.completions.create(n=3, **kw)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    alone = [c.completions.create(**{**kw, "seed": 11 + i}) for i in range(3)]
    texts = [out.choices[0].text for out in alone]
    assert [ch.text for ch in many.choices] == texts and len(set(texts)) > 1
    assert many.usage.prompt_tokens == len(gen.encode(PROMPT)) and many.usage.completion_tokens == 36
    for counted in ("drafted_tokens", "accepted_tokens"):    # the stats of every choice together
        assert many.model_extra["speculation"][counted] == sum(out.model_extra["speculation"][counted]
                                                               for out in alone)
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                     temperature=0, n=2, extra_body={"ignore_eos": True})
    one = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert [ch.message.content for ch in chat.choices] == [one.choices[0].message.content] * 2
    assert wait_idle(srv)["running"] == 0


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_n_streamed_choices_each_end_once_and_the_stats_come_last(server, kind):
    srv, gen = server
    c = client(srv)
    common = dict(model=MODEL, max_tokens=10, temperature=0.8, seed=3, n=3,       # a fixed k: the same draws
                  extra_body={"ignore_eos": True, "speculation": {"policy": "fixed:3"}})
    if kind == "chat":
        messages = [{"role": "user", "content": "hi"}]
        make = lambda **kw: c.chat.completions.create(messages=messages, **common, **kw)  # noqa: E731
        text_of = lambda ch: ch.delta.content or ""  # noqa: E731
        whole = [ch.message.content for ch in make().choices]
    else:
        make = lambda **kw: c.completions.create(prompt=PROMPT, **common, **kw)  # noqa: E731
        text_of = lambda ch: ch.text  # noqa: E731
        whole = [ch.text for ch in make().choices]
    chunks = list(make(stream=True, stream_options={"include_usage": True}))
    texts = ["".join(text_of(ch.choices[0]) for ch in chunks if ch.choices and ch.choices[0].index == i)
             for i in range(3)]
    assert texts == whole
    if kind == "chat":                                    # each choice opens with its own role chunk
        firsts = [next(ch for ch in chunks if ch.choices and ch.choices[0].index == i) for i in range(3)]
        assert all(ch.choices[0].delta.role == "assistant" for ch in firsts)
    plain_spec = (make().model_extra if kind == "completion" else make().model_extra)["speculation"]
    for counted in ("drafted_tokens", "accepted_tokens", "target_calls"):
        assert chunks[-1].model_extra["speculation"][counted] == plain_spec[counted]
    finals = sorted(ch.choices[0].index for ch in chunks if ch.choices and ch.choices[0].finish_reason)
    assert finals == [0, 1, 2]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert chunks[-1].usage.prompt_tokens == make().usage.prompt_tokens                # the prompt once
    assert "speculation" in chunks[-1].model_extra
    plain = list(make(stream=True))                       # without include_usage the last finish carries the stats
    assert plain[-1].choices[0].finish_reason == "length" and "speculation" in plain[-1].model_extra
    assert sum("speculation" in ch.model_extra for ch in plain) == 1


def test_n_choices_that_cannot_fit_are_a_400_that_do_not_fit_now_a_429_and_none_runs(bundle):
    with running(bundle, max_batch=1, max_queue=1, slow=0.02) as (srv, gen):
        never = post(srv, "/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 50, "n": 3})
        message = assert_openai_error(never, 400, "n")["message"]
        assert "at most 2 sequences (--max-batch 1 plus --max-queue 1)" in message
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True, "speculation": "off"}
        with httpx.stream("POST", srv.url + "/completions", json=body, timeout=30) as busy:
            lines = busy.iter_lines()                       # kept: a dropped line iterator closes the response
            assert next(lines).startswith("data: ")
            chunks = gen.counters["prefill_chunks"]
            full = post(srv, "/completions", {"model": MODEL, "prompt": "x", "max_tokens": 5, "n": 2})
            assert assert_openai_error(full, 429)["code"] == "queue_full" and full.headers["retry-after"] == "1"
            assert gen.counters["prefill_chunks"] == chunks                    # no choice of it was prefilled
        assert wait_idle(srv)["running"] == 0
        out = client(srv).completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, n=2, temperature=0)
        assert len(out.choices) == 2 and out.usage.completion_tokens <= 6


def test_a_client_that_leaves_ends_every_choice(bundle, caplog):
    import gc
    caplog.set_level(logging.ERROR, logger="asyncio")
    with running(bundle, max_batch=2, max_queue=1, slow=0.02) as (srv, gen):
        for stream in (True, False):
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "n": 3, "stream": stream,
                    "ignore_eos": True, "speculation": "off"}                  # one token per step
            before = gen.counters.get("steps", 0)
            if stream:
                with httpx.stream("POST", srv.url + "/completions", json=body, timeout=30) as response:
                    assert next(response.iter_lines()).startswith("data: ")
            else:
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(srv.url + "/completions", json=body, timeout=0.3)
            state = wait_idle(srv)
            assert state["running"] == 0 and state["waiting"] == 0
            assert gen.counters["steps"] - before < 60                   # not the 200 steps a choice left running
        gc.collect()                                 # a cancelled future nobody read logs its error when collected
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


def test_a_choice_queued_behind_its_siblings_past_the_timeout_ends_empty(bundle):
    """One slot: choice 1 waits for choice 0; past the request's timeout it ends with no text, the request does not
    fail (alone, a request that times out before its first token is a 503)."""
    with running(bundle, max_batch=1, max_queue=2, slow=0.02) as (srv, gen):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 100, "n": 2, "ignore_eos": True, "timeout": 0.8,
                "speculation": "off"}
        out = post(srv, "/completions", body)
        assert out.status_code == 200, out.text
        first, second = out.json()["choices"]
        assert first["text"] and second["text"] == "" and second["finish_reason"] == "length"
        assert wait_idle(srv)["running"] == 0
        with httpx.stream("POST", srv.url + "/completions", json={**body, "stream": True}, timeout=30) as response:
            events = sse_events(response.iter_lines())
        assert events[-1] == "[DONE]" and "error" not in events[-2]
        text = {0: "", 1: ""}
        for event in events[:-1]:
            text[event["choices"][0]["index"]] += event["choices"][0]["text"]
        ends = [e["choices"][0]["index"] for e in events[:-1] if e["choices"][0]["finish_reason"]]
        assert text[0] and text[1] == "" and sorted(ends) == [0, 1] and "speculation" in events[-2]
        assert wait_idle(srv)["running"] == 0


def test_n_choices_that_all_time_out_before_a_token_are_a_503_streamed_or_not(bundle):
    """As one request that times out before its first token: no choice is an answer, so the request is an error (a
    503 with Retry-After; streamed, an error event after the role chunks, and no choice's finish)."""
    with running(bundle, max_batch=2, max_queue=2, slow=0.6) as (srv, gen):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20, "n": 2, "timeout": 0.3, "speculation": "off"}
        err = assert_openai_error(post(srv, "/completions", body), 503)
        assert err["code"] == "timeout" and wait_idle(srv)["running"] == 0
        with httpx.stream("POST", srv.url + "/chat/completions", timeout=30, json={
                **{k: v for k, v in body.items() if k != "prompt"}, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as response:
            assert response.status_code == 200
            events = sse_events(response.iter_lines())
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "timeout"
        assert not [e for e in events[:-2] if e["choices"][0]["finish_reason"] is not None]
        assert wait_idle(srv)["running"] == 0
        # echo: the prompt would come with a choice's first chunk or its end; neither may precede the error
        with httpx.stream("POST", srv.url + "/completions", timeout=30,
                          json={**body, "stream": True, "echo": True}) as response:
            events = sse_events(response.iter_lines())
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "timeout" and len(events) == 2
        assert wait_idle(srv)["running"] == 0


def test_greedy_output_equals_specedge_generate_while_other_requests_run(server, bundle, capsys):
    srv, gen = server
    assert main(["generate", str(bundle), "--prompt", PROMPT, "--max-new-tokens", "40", "--ignore-eos", "--json",
                 "--threads", "1"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main(["generate", str(bundle), "--prompt", "hi", "--chat", "--max-new-tokens", "30", "--ignore-eos",
                 "--json", "--threads", "1"]) == 0
    expected_chat = json.loads(capsys.readouterr().out)
    c = client(srv)
    background, errors = [], []

    def other(prompt, i):
        try:
            stream = c.completions.create(model=MODEL, prompt=prompt, max_tokens=60, temperature=0.8, seed=i,
                                          stream=True, extra_body={"ignore_eos": True})
            background.append("".join(ch.choices[0].text for ch in stream))
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=other, args=(p, i)) for i, p in enumerate(OTHERS)]
    for t in threads:
        t.start()
    out = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                               extra_body={"ignore_eos": True})
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=30,
                                     temperature=0,
                                     extra_body={"ignore_eos": True, "speculation": {"policy": "fixed:4"}})
    for t in threads:
        t.join(60)
    assert not errors and len(background) == len(OTHERS)
    assert out.choices[0].text == expected["text"] and out.usage.completion_tokens == len(expected["tokens"])
    assert chat.choices[0].message.content == expected_chat["text"]
    assert max(e.batch for e in gen.events[-200:]) >= 2           # it really shared steps with the others


def test_four_hundreds_are_in_openai_shape_and_the_server_goes_on(server):
    srv, gen = server
    base = {"model": MODEL, "prompt": "x"}
    cases = [
        ({**base, "n": 0}, "n"), ({**base, "n": 129}, "n"), ({**base, "n": 1.5}, "n"),
        ({**base, "presence_penalty": -3}, "presence_penalty"), ({**base, "best_of": 2}, "best_of"),
        ({**base, "logprobs": 6}, "logprobs"),
        ({**base, "suffix": "s"}, "suffix"),
        ({**base, "logit_bias": {"1": 500}}, "logit_bias"), ({**base, "bogus": 1}, "bogus"),
        ({**base, "temperature": -1}, "temperature"), ({**base, "max_tokens": 0}, "max_tokens"),
        ({**base, "prompt": "y" * 300}, "prompt"), ({**base, "max_tokens": 256}, "max_tokens"),
        ({**base, "speculation": {"policy": "fixed:99"}}, "speculation"),
        ({**base, "speculation": {"policy": "sometimes"}}, "speculation"),
        ({**base, "speculation": 5}, "speculation"), ({"prompt": "x"}, "model"),
    ]
    for body, param in cases:
        assert_openai_error(post(srv, "/completions", body), 400, param)
    long = assert_openai_error(post(srv, "/completions", {**base, "prompt": "y" * 300}), 400)
    assert "256" in long["message"] and "300" in long["message"] and long["code"] == "context_length_exceeded"
    fits = assert_openai_error(post(srv, "/completions", {**base, "prompt": "y" * 10, "max_tokens": 250}), 400)
    assert "260 tokens (10 in the prompt, 250 for the completion)" in fits["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for body, param in [({**chat, "top_logprobs": 2}, "top_logprobs"),
                        ({**chat, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                        ({**chat, "logprobs": "yes"}, "logprobs"), ({**chat, "tools": [{"type": "function"}]}, "tools"),
                        ({**chat, "response_format": {"type": "xml"}}, "response_format"),
                        ({**chat, "messages": []}, "messages"),
                        ({**chat, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                         "messages[0].content"),
                        ({**chat, "messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
                        ({**chat, "chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
                        ({**chat, "chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
                        # bookkeeping fields without effect, still type-checked as OpenAI's API does
                        ({**chat, "user": 7}, "user"), ({**chat, "metadata": "x"}, "metadata"),
                        ({**chat, "metadata": {"k": 1}}, "metadata"),
                        ({**chat, "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
                        ({**chat, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
                        ({**chat, "safety_identifier": ["a"]}, "safety_identifier"),
                        ({**chat, "prompt_cache_key": 1}, "prompt_cache_key")]:
        assert_openai_error(post(srv, "/chat/completions", body), 400, param)
    # a lone surrogate is valid JSON but not text: a 400 naming the field, not a 500 from the tokenizer
    for path, body, param in [("/completions", b'{"model": "%s", "prompt": "\\ud800"}', "prompt"),
                              ("/completions", b'{"model": "%s", "prompt": "x", "stop": "\\udcff"}', "stop"),
                              ("/chat/completions", b'{"model": "%s", "messages": [{"role": "user", '
                                                    b'"content": "a\\ud800"}]}', "messages[0].content")]:
        bad = assert_openai_error(httpx.post(srv.url + path, content=body % MODEL.encode(), timeout=10), 400, param)
        assert "not valid Unicode" in bad["message"]
    assert_openai_error(post(srv, "/completions", {**base, "model": "gpt-4"}), 404, "model")
    assert "must be a string" in assert_openai_error(post(srv, "/completions", {**base, "model": [MODEL]}), 400,
                                                     "model")["message"]
    assert_openai_error(httpx.post(srv.url + "/completions", content=b"{not json", timeout=10), 400)
    assert_openai_error(httpx.post(srv.url + "/completions", content=b"[" * 100_000 + b"]" * 100_000, timeout=10), 400)
    assert_openai_error(httpx.post(srv.url + "/completions", content=b"x" * ((1 << 20) + 1), timeout=10), 413)
    assert_openai_error(httpx.get(srv.url + "/nowhere"), 404)
    assert_openai_error(httpx.get(srv.url + "/completions"), 405)
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client(srv).completions.create(model=MODEL, prompt="x", best_of=3)
    # default values that clients send anyway are accepted
    ok = post(srv, "/completions", {**base, "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": None,
                                    "echo": False, "best_of": 1, "logit_bias": {}, "user": "me", "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    ok = post(srv, "/chat/completions", {**chat, "logprobs": False, "tools": [], "tool_choice": "none",
                                         "response_format": {"type": "text"}, "max_completion_tokens": 2,
                                         "stream": False, "store": False, "parallel_tool_calls": True,
                                         "chat_template_kwargs": {"enable_thinking": False}, "metadata": {"a": "b"},
                                         "safety_identifier": "u1", "prompt_cache_key": "k", "user": None})
    assert ok.status_code == 200, ok.text
    assert health(srv)["status"] == "ok"


def test_a_request_past_its_timeout_ends_with_what_it_has(bundle):
    with running(bundle, max_batch=1, slow=0.02) as (srv, gen):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
                "speculation": "off"}                                   # one token per step: 200 steps take 4 s
        with httpx.stream("POST", srv.url + "/completions", json={**body, "stream": True}, timeout=30):
            # the only slot is busy: a request that times out before its first token is a 503
            err = assert_openai_error(post(srv, "/completions", {**body, "timeout": 0.3}), 503)
            assert err["code"] == "timeout"
        out = client(srv).completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, temperature=0,
                                             extra_body={"ignore_eos": True, "timeout": 0.6, "speculation": "off"})
        assert out.choices[0].finish_reason == "length" and 0 < out.usage.completion_tokens < 200
        assert out.model_extra["speculation"]["stop_reason"] == "timeout"
        assert wait_idle(srv)["running"] == 0
        for _ in range(3):          # idle, with a deadline past before any token can be made: a 503 every time
            err = assert_openai_error(post(srv, "/completions", {**body, "timeout": 1e-9}), 503)
            assert err["code"] == "timeout" and "busy" not in err["message"]
        assert wait_idle(srv)["running"] == 0


def test_a_client_that_disconnects_frees_its_slot(bundle, caplog):
    caplog.set_level(logging.INFO, logger="specedge.serve")
    with running(bundle, max_batch=1, max_queue=0, slow=0.02) as (srv, gen):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True, "speculation": "off"}                # one token per step
        with httpx.stream("POST", srv.url + "/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            assert health(srv)["running"] == 1
        state = wait_idle(srv)                                         # closed mid-stream: freed at a step boundary
        assert state["running"] == 0 and state["waiting"] == 0
        # a non-streamed request whose client gives up frees its slot too
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/completions", json={**body, "stream": False}, timeout=0.5)
        assert wait_idle(srv)["running"] == 0
        out = client(srv).completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
        assert out.usage.completion_tokens <= 3                         # the slot serves the next request
        assert gen.counters["steps"] < 150                              # the abandoned ones did not run to the end
        # a client that leaves before its body arrives: a 499 in the log, not an internal error
        host, port = srv.base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"model\"")
        end = time.monotonic() + 5
        while not any("before its request body arrived" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < end, [r.getMessage() for r in caplog.records][-3:]
            time.sleep(0.02)
        assert health(srv)["status"] == "ok"
    assert any("client_disconnected" in r.getMessage() for r in caplog.records)
    assert not any("internal error" in r.getMessage() for r in caplog.records)


def test_a_full_queue_is_429_with_retry_after(bundle):
    with running(bundle, max_batch=1, max_queue=1, slow=0.02) as (srv, gen):
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/completions", json=body, timeout=30) as first, \
                httpx.stream("POST", srv.url + "/completions", json=body, timeout=30) as second:
            assert first.status_code == second.status_code == 200
            full = post(srv, "/completions", {**body, "stream": False, "max_tokens": 2})
            err = assert_openai_error(full, 429)
            assert full.headers["retry-after"] == "1" and err["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                client(srv).completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert wait_idle(srv)["running"] == 0


def test_an_api_key_is_required_when_set(bundle):
    with running(bundle, max_batch=1, api_key="sekrit") as (srv, gen):
        with pytest.raises(openai.AuthenticationError):
            client(srv).models.list()
        with pytest.raises(openai.AuthenticationError):
            client(srv, api_key="wrong").completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert_openai_error(httpx.get(srv.url + "/models"), 401)
        assert_openai_error(httpx.post(srv.base + "/tokenize", json={"prompt": "x"}), 401)
        out = client(srv, api_key="sekrit").completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert out.usage.completion_tokens <= 2
        assert httpx.get(srv.base + "/health").status_code == 200     # health and metrics stay open (loopback)


def _samples(text: str) -> dict:
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values


def test_metrics_equal_the_sum_of_the_responses(bundle):
    with running(bundle, max_batch=4) as (srv, gen):
        c = client(srv)
        responses = []
        for i, spec in enumerate(["off", {"policy": "fixed:3"}, {"policy": "adaptive"}, {"policy": "fixed:5"},
                                  {"policy": "heuristic"}]):
            kw = dict(model=MODEL, max_tokens=12 + 5 * i, temperature=0 if i % 2 else 0.7, seed=i,
                      extra_body={"speculation": spec, "ignore_eos": True})
            if i % 2:
                responses.append(c.completions.create(prompt=OTHERS[i % 3], **kw))
            else:
                chunks = list(c.chat.completions.create(messages=[{"role": "user", "content": "hi"}], stream=True,
                                                        stream_options={"include_usage": True}, **kw))
                responses.append(chunks[-1])
        values = _samples(httpx.get(srv.base + "/metrics").text)
        specs = [r.model_extra["speculation"] for r in responses]

        def metric(name, **labels):
            return values.get((f"specedge:{name}", tuple(sorted(labels.items()))), 0.0)

        assert metric("spec_decode_num_draft_tokens_total") == sum(s["drafted_tokens"] for s in specs) > 0
        assert metric("spec_decode_num_accepted_tokens_total") == sum(s["accepted_tokens"] for s in specs) > 0
        assert metric("spec_decode_num_drafts_total") == sum(s["verify_calls"] for s in specs)
        assert sum(v for (name, _), v in values.items()
                   if name == "specedge:spec_decode_num_accepted_tokens_per_pos_total") == sum(
            s["accepted_tokens"] for s in specs)
        assert metric("generation_tokens_total") == sum(r.usage.completion_tokens for r in responses)
        assert metric("prompt_tokens_total") == sum(r.usage.prompt_tokens for r in responses)
        assert metric("prefix_cache_hits_total") == sum(r.usage.prompt_tokens_details.cached_tokens for r in responses)
        assert metric("prompt_cache_texts") == gen.scheduler.cache.count() > 0
        assert metric("request_success_total", finished_reason="length") == len(responses)
        assert metric("e2e_request_latency_seconds_count") == metric("time_to_first_token_seconds_count") == 5
        assert metric("num_requests_running") == metric("num_requests_waiting") == 0
        assert metric("decode_steps_without_draft_total") > 0           # the "off" request ran k = 0 steps
        steps_total = int(sum(v for (name, _), v in values.items() if name == "specedge:decode_steps_total"))
        assert steps_total > 0
        # the step log: every decode step, numbered, with what it drafted and accepted
        steps = httpx.get(srv.url + "/speculation/steps", params={"recent": 4096}).json()
        recent = steps["recent"]
        assert steps["steps"] == len(recent) == steps_total
        assert [r["step"] for r in recent] == list(range(1, steps_total + 1))
        assert sum(sum(r["k"]) for r in recent) == sum(s["drafted_tokens"] for s in specs)
        assert sum(sum(r["accepted"]) for r in recent) == sum(s["accepted_tokens"] for s in specs)
        assert all(r["batch"] == 1 and r["verify_s"] > 0 for r in recent)        # one request at a time
        assert all(a["ended"] <= b["ended"] for a, b in zip(recent, recent[1:]))
        assert any(r["draft_calls"] == 0 for r in recent) and any(r["draft_calls"] > 0 for r in recent)
        tail = httpx.get(srv.url + "/speculation/steps", params={"after": steps_total - 2}).json()["recent"]
        assert [r["step"] for r in tail] == [steps_total - 1, steps_total]
        assert_openai_error(httpx.get(srv.url + "/speculation/steps", params={"recent": "-1"}), 400, "recent")


def test_sixteen_concurrent_streams_lose_nothing_and_leave_no_slot_busy(server):
    srv, gen = server
    c = client(srv)
    results, errors = {}, []
    solo = gen.generate(PROMPT, max_new_tokens=24, ignore_eos=True, use_draft=False).text

    def one(i):
        try:
            spec = ["off", {"policy": "fixed:4"}, {"policy": "adaptive"},
                    {"policy": "fixed:2", "drafter": "hybrid"}][i % 4]
            stream = c.completions.create(model=MODEL, prompt=PROMPT if i % 2 else OTHERS[i % 3], max_tokens=24,
                                          temperature=0, stream=True, stream_options={"include_usage": True},
                                          extra_body={"speculation": spec, "ignore_eos": True})
            chunks = list(stream)
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
            results[i] = (text, chunks[-1].usage.completion_tokens)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert time.monotonic() - started < 90
    assert not errors and sorted(results) == list(range(16))
    assert all(n == 24 for _, n in results.values())
    assert all(results[i][0] == solo for i in range(1, 16, 2))         # every greedy row got its solo output
    assert wait_idle(srv) == {**health(srv), "running": 0, "waiting": 0}
    rejections = httpx.get(srv.url + "/speculation/rejections", params={"recent": 5}).json()
    assert rejections["steps"] > 0 and len(rejections["recent"]) <= 5 and "by_draft_class" in rejections
    assert_openai_error(httpx.get(srv.url + "/speculation/rejections", params={"recent": "x"}), 400, "recent")


def test_shutdown_drains_in_flight_requests_then_cancels_the_rest(bundle):
    body = {"model": MODEL, "prompt": PROMPT, "temperature": 0, "stream": True, "ignore_eos": True,
            "speculation": "off"}
    with running(bundle, max_batch=2, slow=0.01, drain_timeout=10) as (srv, gen):
        with httpx.stream("POST", srv.url + "/completions", json={**body, "max_tokens": 40}, timeout=30) as response:
            lines = response.iter_lines()
            next(lines)
            srv.server.should_exit = True                               # what SIGTERM does
            events = sse_events(lines)
        assert events[-1] == "[DONE]" and events[-2]["speculation"]["stop_reason"] == "max_new_tokens"
        srv.thread.join(10)
        assert not srv.thread.is_alive()
    with running(bundle, max_batch=2, slow=0.02, drain_timeout=0.3) as (srv, gen):
        with httpx.stream("POST", srv.url + "/completions", json={**body, "max_tokens": 200}, timeout=30) as response:
            lines = response.iter_lines()
            next(lines)
            started = time.monotonic()
            srv.server.should_exit = True
            events = sse_events(lines)                                  # cancelled once the drain time is over
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"
        srv.thread.join(10)
        assert not srv.thread.is_alive() and time.monotonic() - started < 5
        for _ in range(100):
            if not gen.scheduler.running:
                break
            time.sleep(0.02)
        assert not gen.scheduler.running                              # cancelled, slot freed
    # a second signal while draining ends the drain at once, each request with its error (not a forced exit)
    with running(bundle, max_batch=2, slow=0.05, drain_timeout=30) as (srv, gen):              # 200 tokens: 10 s
        with httpx.stream("POST", srv.url + "/completions", json={**body, "max_tokens": 200}, timeout=30) as response:
            lines = response.iter_lines()
            next(lines)
            started = time.monotonic()
            srv.server.should_exit = True                               # the first SIGTERM
            while srv.server._draining_loop is None:
                time.sleep(0.01)
            srv.server.handle_exit(signal.SIGINT, None)                 # then Ctrl+C
            events = sse_events(lines)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"
        srv.thread.join(10)
        assert not srv.thread.is_alive() and time.monotonic() - started < 5 and not srv.server.force_exit


def test_connections_to_the_listening_socket_send_without_nagle_s_delay():
    """Each accepted connection gets TCP_NODELAY (asyncio sets it only on sockets made with IPPROTO_TCP): without it a
    kept-alive connection waited ~40 ms per response for the client's delayed ACK, in every TTFT bench-serve took."""
    from specedge.serve.server import listen

    async def accepted_nodelay() -> int:
        sock = listen("127.0.0.1", 0)
        seen = asyncio.get_running_loop().create_future()

        def connected(reader, writer):
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(connected, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            value = await asyncio.wait_for(seen, 5)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


def test_a_third_signal_while_draining_forces_the_exit():
    """The second cancels what runs; if a request still does not end, the third exits anyway."""
    import uvicorn

    from specedge.serve.server import _DrainingServer

    server = _DrainingServer(uvicorn.Config(app=None), service=None, drain_timeout=30)
    loop = asyncio.new_event_loop()
    try:
        server.handle_exit(signal.SIGTERM, None)
        assert server.should_exit and not server.force_exit
        server._draining_loop = loop                                   # shutdown has begun
        server.handle_exit(signal.SIGTERM, None)
        assert not server.force_exit                                   # the cancel is scheduled on the loop
        server.handle_exit(signal.SIGINT, None)
        assert server.force_exit
    finally:
        loop.close()


def test_bench_serve_writes_results_and_plots(server, tmp_path, capsys):
    srv, gen = server
    out = tmp_path / "bench"
    assert main(["bench-serve", "--url", srv.url, "--concurrency", "1,2", "--policies", "target,fixed:2",
                 "--requests", "2", "--max-tokens", "6", "--repeat", "3", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["levels"] == [1, 2] and results["model"] == MODEL and results["repeat"] == 3
    entry = results["runs"]["fixed:2"]["2"]
    assert entry["requests"] == 6 and entry["errors"] == 0 and entry["output_tok_per_s"] > 0
    per_repeat = entry["output_tok_per_s_per_repeat"]
    assert len(per_repeat) == 3 and entry["output_tok_per_s"] == sorted(per_repeat)[1]      # the median of 3
    target = results["runs"]["target"]["2"]["output_tok_per_s_per_repeat"]
    assert entry["vs_best_other_per_repeat"] == pytest.approx([a / b for a, b in zip(per_repeat, target)])
    assert entry["vs_best_other"] == pytest.approx(sorted(a / b for a, b in zip(per_repeat, target))[1])
    assert entry["ttft_s"]["p50"] > 0 and entry["tpot_s"]["p99"] >= entry["tpot_s"]["p50"]
    assert (out / "serve_throughput.png").exists() and (out / "serve_tpot.png").exists()
    # each cell's steps read back from the server and priced against plain steps: target-only has none with k > 0
    assert results["runs"]["target"]["2"]["steps_gain_per_repeat"] == [0.0, 0.0, 0.0]
    gains = entry["steps_gain_per_repeat"]
    assert len(gains) == 3 and all(isinstance(g, float) and g > -1.0 for g in gains)
    assert entry["steps_gain"] == sorted(gains)[1]
    assert "steps gain" in capsys.readouterr().out
    assert main(["bench-serve"]) == 2                                  # neither a bundle nor --url: one-line error
    # a cell whose every request failed measured nothing: exit 1 naming the first error (results still written)
    bad = tmp_path / "bad"
    code = main(["bench-serve", "--url", srv.url, "--concurrency", "1", "--policies", "target,fixed:99",
                 "--requests", "1", "--max-tokens", "2", "--out", str(bad)])
    err = capsys.readouterr().err
    assert code == 1 and "1 cell(s) had no successful request, first fixed:99 at concurrency 1" in err, err
    assert (bad / "results.json").exists()


def test_sigterm_stops_the_command_cleanly(bundle, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    with serve_process([str(bundle), "--port", str(port), "--max-batch", "2", "--threads", "1",
                        "--served-model-name", MODEL], log) as proc:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        out = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
        assert out.usage.completion_tokens <= 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    text = log.read_text()
    assert "POST /v1/completions 200" in text and "stopped" in text and "Traceback" not in text


def test_serve_refuses_a_busy_port_and_an_empty_key_in_one_line(bundle, capsys, monkeypatch):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", str(bundle), "--port", str(port)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and err[-1].startswith(f"specedge: error: cannot listen on 127.0.0.1:{port}"), err
        assert not any("serving" in line or "Traceback" in line for line in err)
    assert main(["serve", str(bundle), "--host", "999.1.1.1"]) == 1
    assert capsys.readouterr().err.strip().startswith("specedge: error: cannot listen on 999.1.1.1")
    assert main(["serve", str(bundle), "--api-key", ""]) == 2
    assert "--api-key (or SPECEDGE_API_KEY) is empty" in capsys.readouterr().err
    assert main(["serve", str(bundle), "--served-model-name", " "]) == 2
    assert "--served-model-name is empty" in capsys.readouterr().err
    assert main(["serve", str(bundle), "--served-model-name", "org/coder/"]) == 2
    assert "ends in '/'" in capsys.readouterr().err
    monkeypatch.setenv("SPECEDGE_API_KEY", "")
    assert main(["serve", str(bundle)]) == 2
    assert "is empty" in capsys.readouterr().err


def test_a_stream_whose_client_leaves_at_once_is_cancelled(bundle):
    """The app called directly, with a client that is gone right after its request: whether or not the stream's
    body started, its sequence is cancelled and nothing stays in flight."""
    from specedge.runtime import load
    from specedge.serve import Limits, create_app
    from serve_helpers import slow_down

    gen = load(bundle, max_batch=1, background=True, threads=1)
    slow_down(gen, 0.02)
    app = create_app(gen, Limits(model=MODEL))
    service = app.state.service
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "stream": True, "ignore_eos": True,
                       "speculation": "off"}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}

    async def main():
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            pass

        async with service.lifespan(app):
            await app(scope, receive, send)

    try:
        asyncio.run(main())
        for _ in range(250):
            if not gen.scheduler.running and not gen.scheduler.waiting:
                break
            time.sleep(0.02)
        assert not gen.scheduler.running and not gen.scheduler.waiting
        assert not service.active and not service._unstarted
        assert gen.counters.get("steps", 0) < 100            # none at all when the cancel comes first
    finally:
        gen.close()
