"""What goes wrong around a shared batch stays with the request it belongs to: a caller's failing callback, a
failure outside a model call, Ctrl+C on the driving thread, dropped streams, close() racing a submit, a nested
call from a callback, a slow reader past its deadline (the cases a review of the concurrency code demonstrated)."""

import asyncio
import gc
import threading
import time

import pytest

from specedge.errors import SpecedgeError
from specedge.runtime import load

OPTS = dict(max_new_tokens=20, ignore_eos=True, k=3)


@pytest.fixture(scope="module")
def bundle(standard_bundles):
    return standard_bundles["qwen2"]


def test_a_failing_on_token_callback_ends_its_own_request_only(bundle):
    gen = load(bundle, max_batch=4, threads=1)
    solo = gen.generate("hello", **OPTS).tokens
    calls = []

    def bad(ids, piece):
        calls.append(ids)
        if len(calls) == 3:
            raise ValueError("bug in caller A's callback")

    with gen.scheduler.wake:                          # all three join the same steps
        streams = [gen.stream("abc", on_token=bad, **OPTS), gen.stream("hello", **OPTS), gen.stream("hello", **OPTS)]
    with pytest.raises(SpecedgeError, match="bug in caller A's callback"):
        streams[0].wait()
    with pytest.raises(SpecedgeError, match="bug in caller A's callback"):
        streams[0].wait()                             # asked again: the same error, not None
    assert [s.wait().tokens for s in streams[1:]] == [solo, solo]


def test_a_failure_outside_a_model_call_ends_the_running_requests_and_the_worker_goes_on(bundle):
    gen = load(bundle, max_batch=4, threads=1, background=True)

    def failing(*args):
        raise RuntimeError("simulated device error during compaction")

    move_slot, gen.target.move_slot = gen.target.move_slot, failing
    with gen.scheduler.wake:                          # the first ends early: the others move down a slot
        streams = [gen.stream("abc", max_new_tokens=3, ignore_eos=True),
                   gen.stream("hello", max_new_tokens=40, ignore_eos=True),
                   gen.stream("world", max_new_tokens=40, ignore_eos=True)]
    assert streams[0].wait().stats.stop_reason == "max_new_tokens"
    for s in streams[1:]:
        with pytest.raises(SpecedgeError, match="simulated device error"):
            s.wait()                                  # an error, not a wait forever on a dead worker
    gen.target.move_slot = move_slot
    assert gen._worker.is_alive() and gen.scheduler.running == []
    assert gen.generate("abc", max_new_tokens=4, ignore_eos=True).stats.new_tokens == 4
    gen.close()


# a long text whose every position the grammar pins down (a state one token off shows at once)
LONG_STRING = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
    "type": "object", "properties": {"s": {"type": "string", "pattern": "^(ab|ba|aab){25}$"}}, "required": ["s"],
    "x-guidance": {"whitespace_flexible": False}}}}


def _ctrl_c_while_another_runs(gen, model, when, mine, other) -> tuple[threading.Event, dict]:
    """Ctrl+C on this (main) thread, as it would be handled when one of `model`'s calls returns (`when(starts,
    tokens)` says which), while it drives its own request `mine` (stream options) and another thread's (`other`
    (): -> a Stream, submitted while this thread drives) -> (the trigger, still set if it never fired; {"result":
    the other request's result})."""
    run = model.run
    armed = threading.Event()

    def interrupted_on_return(starts, tokens, *args, **kwargs):
        out = run(starts, tokens, *args, **kwargs)
        if armed.is_set() and threading.current_thread() is threading.main_thread() and when(starts, tokens):
            armed.clear()
            raise KeyboardInterrupt
        return out

    model.run = interrupted_on_return
    stream = gen.stream("abc", **mine)
    next(stream)                                      # this (main) thread drives
    outcome, joined = {}, threading.Event()

    def client():
        submitted = other()
        joined.set()
        time.sleep(0.3)                               # the main thread drives both rows meanwhile
        outcome["result"] = submitted.wait()

    thread = threading.Thread(target=client)
    thread.start()
    joined.wait()
    armed.set()
    with pytest.raises(KeyboardInterrupt):
        stream.wait()
    thread.join(60)
    assert stream._seq.cancelled.is_set()             # the interrupted caller's own request does not run on
    return armed, outcome


@pytest.mark.parametrize("opts", [dict(max_new_tokens=60, ignore_eos=True, k=4),
                                  dict(max_new_tokens=60, k=4, response_format=LONG_STRING)],   # its grammar too
                         ids=["plain", "structured"])
def test_ctrl_c_on_the_driving_thread_leaves_the_other_requests_whole(bundle, opts):
    gen = load(bundle, max_batch=4, threads=1)
    solo = gen.generate("hello world", **opts).tokens
    _, outcome = _ctrl_c_while_another_runs(gen, gen.target, lambda starts, tokens: len(starts) >= 2,  # a verify
                                            opts, lambda: gen.stream("hello world", **opts))
    assert outcome["result"].tokens == solo           # the half-stepped row was rewound, RNG and positions


def test_dropped_streams_do_not_fill_the_queue_for_good(bundle):
    gen = load(bundle, max_batch=1, max_queue=2, threads=1)
    for _ in range(3):
        gen.stream("abc", max_new_tokens=5)            # dropped at once: cancelled, never iterated
    gc.collect()
    assert len(gen.scheduler.waiting) == 3
    assert gen.generate("hello", max_new_tokens=5, ignore_eos=True).stats.stop_reason == "max_new_tokens"


def test_a_request_racing_close_is_refused_or_runs_never_lost(bundle):
    gen = load(bundle, max_batch=2, threads=1, background=True)
    gen.generate("abc", max_new_tokens=2)             # the worker is up and idle
    outcomes = []

    def submit():
        try:
            outcomes.append(gen.stream("hello", max_new_tokens=3, ignore_eos=True).wait().stats.stop_reason)
        except SpecedgeError as err:
            outcomes.append(str(err))

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    gen.close()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a request was accepted and never run"
    assert all(o in ("max_new_tokens", "this generator is closed") for o in outcomes) and len(outcomes) == 4


@pytest.mark.parametrize("background", [False, True])
def test_a_nested_call_from_on_token_is_an_error_not_a_hang(bundle, background):
    gen = load(bundle, max_batch=2, threads=1, background=background)
    errors = []

    def nested(ids, piece):
        if not errors:
            try:
                gen.generate("x", max_new_tokens=2)
            except SpecedgeError as err:
                errors.append(str(err))

    assert gen.generate("abc", max_new_tokens=6, ignore_eos=True, on_token=nested).stats.new_tokens == 6
    assert errors and "cannot be called from an on_token callback" in errors[0]
    gen.close()


@pytest.mark.parametrize("background", [False, True])
def test_a_stop_button_thread_cancels_and_waits_while_another_iterates(bundle, background):
    """A UI's reading thread iterates; a Stop button's thread calls cancel() then wait(): both return, with one
    result, and every token is counted once (a second reader used to wait forever for the end the first took)."""
    gen = load(bundle, max_batch=2, threads=1, background=background)
    for _ in range(3):
        stream = gen.stream("hello", max_new_tokens=200, ignore_eos=True, k=3)
        pieces, results, started = [], [], threading.Event()

        def read():
            for piece in stream:
                pieces.append(piece)
                started.set()

        def stop():
            started.wait(10)
            stream.cancel()
            results.append(stream.wait())

        threads = [threading.Thread(target=read), threading.Thread(target=stop)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads), "a thread waits for an end another one read"
        assert results == [stream.result] and stream.result.stats.stop_reason == "cancelled"
        assert stream.tokens == stream.result.tokens and len(stream.tokens) < 200
    gen.close()


@pytest.mark.parametrize("background", [False, True])
def test_closing_or_reading_a_stream_from_its_own_callback_does_not_hang(bundle, background):
    """close() inside on_token cancels (it never waits); reading the stream there, which would wait for the step
    running it, is a clear error."""
    gen = load(bundle, max_batch=2, threads=1, background=background)
    box, errors = [], []

    def on_token(ids, piece):
        if not box:
            return
        try:
            next(box[0])
        except SpecedgeError as err:
            errors.append(str(err))
        box[0].close()

    stream = gen.stream("abc", max_new_tokens=100, ignore_eos=True, on_token=on_token)
    box.append(stream)
    assert stream.wait().stats.stop_reason == "cancelled" and len(stream.tokens) < 100
    assert errors and "cannot be read from an on_token callback" in errors[0]
    gen.close()


@pytest.mark.parametrize("background", [False, True])
def test_a_stop_handler_holding_the_lock_its_callback_takes_does_not_hang(bundle, background):
    """A desktop app: on_token takes the UI lock; the Stop handler closes the stream while holding it."""
    gen = load(bundle, max_batch=2, threads=1, background=background)
    ui, started, box = threading.Lock(), threading.Event(), []

    def on_token(ids, piece):
        started.set()
        with ui:
            pass

    stream = gen.stream("hello", max_new_tokens=200, ignore_eos=True, on_token=on_token)
    reader = threading.Thread(target=lambda: box.append(stream.wait()))
    reader.start()
    assert started.wait(10)
    with ui:
        stream.close()                                   # returns at once, though the callback waits for `ui`
    reader.join(20)
    assert not reader.is_alive() and box[0].stats.stop_reason == "cancelled"
    gen.close()


def test_a_slow_reader_past_its_deadline_still_gets_a_request_that_finished_in_time(bundle):
    pytest.importorskip("starlette")
    from specedge.serve.bridge import Bridge

    gen = load(bundle, max_batch=2, threads=1, background=True)

    async def read_slowly():
        req = Bridge(gen).open(gen.encode("hello"), timeout=0.5, max_new_tokens=20, ignore_eos=True)
        n = 0
        async for _ in req.events():
            n += 1
            if n == 1:
                while gen.scheduler.running:          # generation ends well within the deadline...
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.6)              # ...and the reader falls behind past it
        return req

    req = asyncio.run(read_slowly())
    gen.close()
    assert req.result.stats.stop_reason == "max_new_tokens" and len(req.tokens) == 20 and not req.timed_out


def test_a_seeded_sampled_row_whose_draft_fell_far_behind_reproduces_in_a_batch(workdir):
    """The hybrid drafter leaves the draft model behind while lookups hit; alone a row caught up at once and
    drafted that step, in a batch one chunk a step, sitting the drafting out: its draws went elsewhere."""
    import tiny_models as tm
    from conftest import _export

    target = tm.make_model("qwen2", 12, seed=5, init_scale=0.5)
    bundle = _export(workdir, "words-256", target, tm.perturbed(target, seed=6, noise=0.04), tm.word_tokenizer(12),
                     max_seq_len=256, max_draft=4, attention="standard")
    gen = load(bundle, max_batch=2, threads=1)
    gen.draft.max_step = 12                           # a catch-up chunk shorter than the lookup streaks here
    other = dict(max_new_tokens=200, ignore_eos=True, k=2)
    for seed in range(3):
        opts = dict(max_new_tokens=250, ignore_eos=True, drafter="hybrid", k=4, temperature=0.3, seed=seed)
        solo = gen.generate_ids([1, 2, 3], **opts).tokens
        with gen.scheduler.wake:
            mine, theirs = gen.stream_ids([1, 2, 3], **opts), gen.stream_ids([4, 5], **other)
        assert mine.wait().tokens == solo, seed
        theirs.wait()
    assert max(e.catch_up_tokens for e in gen.events) > 12     # a catch-up longer than one chunk did happen


def test_ctrl_c_in_a_scoring_prefill_scores_each_prompt_token_once(bundle):
    """Ctrl+C after a prefill chunk's scores were taken (while the draft gets the chunk): the chunk is fed again,
    and its scores are not counted twice."""
    gen = load(bundle, max_batch=2, threads=1)
    prompt = "hello world " * 12                       # three prefill chunks, the first 64 tokens
    scoring = dict(max_new_tokens=60, ignore_eos=True, k=4, prompt_logprobs=0)   # long enough that the draft is fed
    expected = gen.generate(prompt, **scoring).prompt_logprobs
    armed, outcome = _ctrl_c_while_another_runs(                  # as the draft's prefill call returns
        gen, gen.draft, lambda starts, tokens: len(tokens[0]) == 64, dict(max_new_tokens=60, ignore_eos=True, k=4),
        lambda: gen.stream(prompt, **scoring))
    assert not armed.is_set()                         # the interruption did come in a scoring prefill
    assert outcome["result"].prompt_logprobs == expected
