"""The serve package's parts on their own: the asyncio <-> worker-thread bridge, request mapping, metrics from step
records, and the rejected-token classes (no HTTP here; tests/test_serve.py runs the server)."""

import asyncio
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from serve_helpers import serve_bundle, slow_down  # noqa: E402
from specedge.errors import SpecedgeError  # noqa: E402
from specedge.runtime import load  # noqa: E402
from specedge.runtime.batch_step import StepRecord  # noqa: E402
from specedge.runtime.async_stream import LoopOutbox  # noqa: E402
from specedge.serve.bridge import Bridge, RequestTimeout  # noqa: E402
from specedge.serve.errors import APIError  # noqa: E402
from specedge.serve.metrics import Metrics  # noqa: E402
from specedge.serve.protocol import Limits, parse  # noqa: E402
from specedge.serve.rejections import RejectionLog, token_class  # noqa: E402

PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def bundle(workdir):
    return serve_bundle(workdir)


@pytest.fixture
def gen(bundle):
    g = load(bundle, max_batch=2, max_queue=2, background=True, threads=1)
    yield g
    g.close()


def test_events_arrive_in_order_and_end_with_the_result(gen):
    expected = gen.generate(PROMPT, max_new_tokens=30, ignore_eos=True)

    async def main():
        req = Bridge(gen).open(gen.encode(PROMPT), max_new_tokens=30, ignore_eos=True, k=3)
        pieces = [piece async for _, piece, _, _ in req.events()]
        return req, pieces

    req, pieces = asyncio.run(main())
    assert req.tokens == expected.tokens == req.result.tokens
    assert "".join(pieces) == req.text == expected.text
    assert req.first_token_at is not None and len(req.token_times) <= len(req.tokens)


def test_cancelling_the_consumer_frees_the_slot(gen):
    slow_down(gen, 0.01)

    async def main():
        bridge = Bridge(gen)
        req = bridge.open(gen.encode(PROMPT), max_new_tokens=200, ignore_eos=True)
        task = asyncio.ensure_future(req.wait())
        while not req.tokens:
            await asyncio.sleep(0.01)
        task.cancel()                                # what a disconnect or a shutdown does to the handler
        with pytest.raises(asyncio.CancelledError):
            await task
        return req

    req = asyncio.run(main())
    assert len(req.tokens) < 200
    for _ in range(300):
        if not gen.scheduler.running and not gen.scheduler.waiting:
            break
        time.sleep(0.01)
    assert not gen.scheduler.running and not gen.scheduler.waiting
    assert len(gen.generate(PROMPT, max_new_tokens=3, ignore_eos=True).tokens) == 3


def test_a_deadline_cancels_and_the_final_result_still_comes(gen):
    slow_down(gen, 0.01)

    async def main():
        req = Bridge(gen).open(gen.encode(PROMPT), timeout=0.2, max_new_tokens=200, ignore_eos=True)
        with pytest.raises(RequestTimeout) as info:
            await req.wait()
        return req, info.value, await req.settle()

    req, err, result = asyncio.run(main())
    assert req.timed_out and err.seconds == pytest.approx(0.2)
    assert result is not None and result.stats.stop_reason == "cancelled"
    assert len(req.tokens) < 200


def test_tokens_made_after_the_deadline_are_the_timeout_however_soon_they_are_read(gen):
    """A reader that comes late finds tokens queued: those made before the deadline count (the slow-reader test in
    test_concurrency_faults.py), those made after it do not, so a deadline already past at the first token is a
    timeout with no token every time, not only when the loop happened to look first."""
    slow_down(gen, 0.05)

    async def main():
        req = Bridge(gen).open(gen.encode(PROMPT), timeout=0.01, max_new_tokens=3, ignore_eos=True)
        end = time.monotonic() + 10
        while req.outbox.queue.empty() or req.outbox.queue._queue[-1][1][0] != "done":   # every event made, none
            assert time.monotonic() < end                                               # read yet
            await asyncio.sleep(0.01)
        with pytest.raises(RequestTimeout):
            await req.wait()
        return req, await req.settle()

    req, result = asyncio.run(main())
    assert req.timed_out and req.tokens == [] and req.first_token_at is None
    assert result is not None and len(result.tokens) == 3        # the runtime's result still comes


def test_a_failing_step_is_an_error_for_its_request_only(gen):
    run, calls = gen.target.run, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return run(*args, **kwargs)

    gen.target.run = failing

    async def main():
        req = Bridge(gen).open(gen.encode(PROMPT), max_new_tokens=20, ignore_eos=True)
        with pytest.raises(SpecedgeError, match="generation failed: RuntimeError: boom"):
            await req.wait()
        again = Bridge(gen).open(gen.encode(PROMPT), max_new_tokens=5, ignore_eos=True)
        return await again.wait()

    assert len(asyncio.run(main()).tokens) == 5                  # the worker goes on


def test_an_outbox_whose_loop_is_gone_drops_events():
    loop = asyncio.new_event_loop()
    outbox = LoopOutbox(loop)
    loop.close()
    outbox.put(("text", "x", [1], None))                                # no exception on the worker thread


def test_the_bridge_needs_a_background_worker(bundle):
    gen = load(bundle)
    with pytest.raises(ValueError, match="background=True"):
        Bridge(gen, asyncio.new_event_loop())


# -- request mapping -----------------------------------------------------------------------------
def test_defaults_and_overrides_map_to_runtime_options(gen):
    limits = Limits(model="m", policy="adaptive")
    req = parse({"model": "m", "prompt": "hi"}, "completion", gen, limits)
    assert req.options["max_new_tokens"] == 16 and req.options["temperature"] == 1.0     # OpenAI's defaults
    assert req.options["policy"] == "adaptive" and req.timeout == limits.request_timeout
    chat = parse({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "chat", gen, limits)
    assert chat.options["max_new_tokens"] == gen.max_seq_len - len(chat.prompt_ids)      # whatever fits
    assert chat.prompt_ids == gen.encode("hi", chat=True)                                # the bundle's template
    off = parse({"model": "m", "prompt": "hi", "speculation": "off"}, "completion", gen, limits)
    assert off.options["policy"] == "target" and off.speculation == "target"
    fixed = parse({"model": "m", "prompt": [1, 2, 3], "speculation": {"policy": "fixed:4", "drafter": "ngram"},
                   "max_tokens": 5, "stop": "\n", "seed": 3, "top_k": 5, "n": 1, "logprobs": None},
                  "completion", gen, limits)
    assert fixed.prompt_ids == [1, 2, 3] and fixed.speculation == "fixed:4@ngram"
    assert fixed.options == dict(temperature=1.0, top_p=1.0, seed=3, stop=("\n",), top_k=5, ignore_eos=False,
                                 policy="fixed:4", drafter="ngram", max_new_tokens=5, logprobs=None, stop_ids=(),
                                 response_format=None, presence_penalty=0.0, frequency_penalty=0.0,
                                 repetition_penalty=1.0, logit_bias=None)
    assert parse({"model": "m", "prompt": "hi", "speculation": "on"}, "completion", gen, limits).speculation == \
        "adaptive@model"
    on = parse({"model": "m", "prompt": "hi", "speculation": "on"}, "completion", gen,
               Limits(model="m", policy="target"))
    assert on.options["policy"] == "adaptive"                            # "on" drafts even where the default is off
    for off in (-1, 0):                                                      # vLLM's two ways to say "no top-k"
        assert parse({"model": "m", "prompt": "hi", "top_k": off}, "completion", gen, limits).options["top_k"] == 0


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "x", "stop_token_ids": "3"}, "stop_token_ids"),
    ({"prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "made_up": 1}, "made_up"),
    ({"prompt": "x", "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [999999]}, "prompt"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "speculation": {"k": 3}}, "speculation"),
    ({"prompt": "x", "timeout": 10**6}, "timeout"),
])
def test_unsupported_or_invalid_parameters_are_refused(gen, body, param):
    with pytest.raises(APIError) as info:
        parse({"model": "m", **body}, "completion", gen, Limits(model="m"))
    assert info.value.status == 400 and info.value.param == param


# -- metrics and rejections from step records ---------------------------------------------------------
def _records():
    return [StepRecord(batch=2, k=[3, 3], accepted=[3, 1], draft_calls=3,
                       rejections=[{"slot": 1, "position": 2, "draft_token": 10, "target_token": 32}], predicted=2.5),
            StepRecord(batch=1, k=[0], accepted=[0]),
            StepRecord(batch=1, k=[2], accepted=[0], draft_calls=2,
                       rejections=[{"slot": 0, "position": 1, "draft_token": 97, "target_token": 40,
                                    "p_draft": 0.1, "q_draft": 0.6}])]


def test_metrics_count_steps_as_vllm_does_plus_k_by_batch():
    metrics = Metrics()
    for record in _records():
        metrics.observe_step(record)
    values = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert values[("specedge:spec_decode_num_drafts_total", ())] == 3
    assert values[("specedge:spec_decode_num_draft_tokens_total", ())] == 8
    assert values[("specedge:spec_decode_num_accepted_tokens_total", ())] == 4
    assert values[("specedge:spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),))] == 2
    assert values[("specedge:spec_decode_num_accepted_tokens_per_pos_total", (("position", "2"),))] == 1
    assert values[("specedge:decode_steps_total", (("batch_size", "2"), ("k", "3")))] == 1
    assert values[("specedge:decode_steps_without_draft_total", ())] == 1
    assert values[("specedge:spec_decode_predicted_accepted_tokens_total", ())] == 2.5
    assert values[("specedge:spec_decode_realised_accepted_tokens_total", ())] == 4
    assert values[("specedge:draft_calls_total", ())] == 5


def test_rejections_aggregate_with_token_classes():
    log = RejectionLog(lambda ids: {10: "\n", 32: "foo", 97: "(", 40: " 42"}[ids[0]])
    for record in _records():
        log.observe_step(record)
    snap = log.snapshot()
    assert snap["rejections"] == 2 and snap["by_draft_class"] == {"newline": 1, "punctuation": 1}
    assert snap["by_target_class"] == {"identifier": 1, "number": 1}
    by_pos = {p["position"]: p for p in snap["by_position"]}
    assert by_pos[1] == {"position": 1, "drafted": 3, "judged": 3, "rejected": 1, "rejection_rate": 1 / 3}
    assert by_pos[2]["judged"] == 2 and by_pos[2]["rejected"] == 1
    assert snap["sampled"] == {"rejections": 1, "mean_p_target": 0.1, "mean_q_draft": 0.6}
    assert [s["draft_text"] for s in snap["recent"]] == ["\n", "("]
    assert snap["top_pairs"][0]["count"] == 1


@pytest.mark.parametrize("text, cls", [(" ", "whitespace"), ("\n\n", "newline"), ("foo_1", "identifier"),
                                       (" def", "keyword"), ("3.14", "number"), ("):", "punctuation"),
                                       ("x=", "mixed"), ("\ufffd", "byte"), ("", "unknown")])
def test_token_classes(text, cls):
    assert token_class(text) == cls
    assert token_class(text, special=True) == "special"


def test_a_gqa_bundle_serves_one_at_a_time_and_says_so_at_start(bundle, arch_bundles, caplog):
    from specedge.serve.engine import EngineConfig, load_engine

    for path, slots, warned in ((arch_bundles["qwen2"], 1, True), (bundle, 8, False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="specedge.serve"):
            gen, limits = load_engine(EngineConfig(bundle=str(path), threads=1))
        gen.close()
        assert gen.max_batch == slots and limits.policy == "adaptive"
        assert any("--attention standard to batch them" in r.message for r in caplog.records) is warned
