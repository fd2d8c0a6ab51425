"""The asyncio API: astream / agenerate / achat give what the blocking calls give, batch concurrent requests,
never run a model call on the event loop, cancel with the task or the block, and raise bad options when awaited."""

import asyncio
import time

import pytest

from specedge.errors import OptionError
from specedge.runtime import AsyncStream, load

PROMPTS = ["def f(x):", "class LRUCache:\n    def __init__(self):\n", "import os\n"]


def slowly(ids, text):
    """An on_token that makes a tiny model's request last long enough to be cancelled midway (~5 ms a commit)."""
    time.sleep(0.005)


def run(coroutine):
    """asyncio.run with a limit: a request nobody drives fails the test instead of hanging the suite."""
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def test_astream_pieces_and_agenerate_equal_generate(good_bundle):
    gen = load(good_bundle)
    expected = gen.generate(PROMPTS[0], max_new_tokens=40, ignore_eos=True, k=4)

    async def main():
        stream = gen.astream(PROMPTS[0], max_new_tokens=40, ignore_eos=True, k=4)
        assert isinstance(stream, AsyncStream)
        pieces = [piece async for piece in stream]
        again = await gen.agenerate(PROMPTS[0], max_new_tokens=40, ignore_eos=True, k=4)
        return stream, pieces, again

    stream, pieces, again = run(main())
    assert "".join(pieces) == stream.text == expected.text and len(pieces) > 1
    ids = gen.encode(PROMPTS[0])
    assert run(gen.agenerate_ids(ids, max_new_tokens=40, ignore_eos=True, k=4)).tokens == expected.tokens
    assert stream.result.tokens == stream.tokens == again.tokens == expected.tokens
    assert stream.result.stats.n_verify > 0
    # the generator now drives from its worker thread; blocking calls still work
    assert gen.generate(PROMPTS[0], max_new_tokens=40, ignore_eos=True, k=4).tokens == expected.tokens
    gen.close()


def test_concurrent_requests_share_a_batch_and_equal_their_solo_runs(standard_bundles):
    gen = load(standard_bundles["qwen2"], max_batch=4)
    options = [dict(max_new_tokens=n, ignore_eos=True, k=k, on_token=slowly) for n, k in ((20, 4), (33, 2), (27, 8))]
    solo = [gen.generate(p, **o).tokens for p, o in zip(PROMPTS, options)]

    async def main():
        return await asyncio.gather(*(gen.agenerate(p, **o) for p, o in zip(PROMPTS, options)))

    results = run(main())
    assert [r.tokens for r in results] == solo
    assert max(e.batch for e in gen.events) >= 2                   # rows shared calls
    gen.close()


def test_the_event_loop_keeps_running_while_the_models_do(good_bundle):
    gen = load(good_bundle)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.002)
                ticks += 1

        task = asyncio.create_task(ticker())
        start = asyncio.get_running_loop().time()
        result = await gen.agenerate(PROMPTS[1], max_new_tokens=120, ignore_eos=True, k=4)
        elapsed = asyncio.get_running_loop().time() - start
        task.cancel()
        return result, ticks, elapsed

    result, ticks, elapsed = run(main())
    assert len(result.tokens) == 120
    # a loop that ran the model calls would not tick at all until the request ended; here it ticks through them
    # (2 ms sleeps: at least a tenth of what the time allows, for a loaded machine where the worker's Python code
    # holds the GIL up to its 5 ms switch interval at a time)
    assert ticks >= max(3, elapsed / 0.002 / 10), (ticks, elapsed)
    gen.close()


def test_cancelling_ends_the_request_and_frees_its_slot(good_bundle):
    gen = load(good_bundle)

    async def main():
        async with gen.astream(PROMPTS[0], max_new_tokens=200, ignore_eos=True, on_token=slowly) as stream:
            async for _ in stream:
                break                                              # leaving the block cancels
        left = await stream.wait()

        task = asyncio.create_task(gen.agenerate(PROMPTS[1], max_new_tokens=200, ignore_eos=True, on_token=slowly))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await gen.agenerate(PROMPTS[2], max_new_tokens=8, ignore_eos=True)   # the slot is free again
        return left, after

    left, after = run(main())
    assert left.stats.stop_reason == "cancelled" and len(left.tokens) < 200
    assert len(after.tokens) == 8
    gen.close()


def test_bad_options_raise_where_the_stream_is_awaited(good_bundle):
    gen = load(good_bundle)
    stream = gen.astream("x", temperature=-1)                      # nothing submitted yet

    async def main():
        with pytest.raises(OptionError, match="temperature"):
            await stream.wait()
        with pytest.raises(OptionError, match="max_new_tokens"):
            await gen.agenerate("x", max_new_tokens=0)

    run(main())
    gen.close()


def test_achat_equals_chat(good_bundle):
    gen = load(good_bundle)
    messages = [{"role": "user", "content": "write a loop"}]
    expected = gen.chat(messages, max_new_tokens=24, ignore_eos=True)

    async def main():
        streamed = [piece async for piece in gen.astream_chat(messages, max_new_tokens=24, ignore_eos=True)]
        return streamed, await gen.achat(messages, max_new_tokens=24, ignore_eos=True)

    streamed, result = run(main())
    assert "".join(streamed) == result.text == expected.text and result.tokens == expected.tokens
    gen.close()


def test_two_tasks_reading_one_stream_share_one_request_and_both_see_the_end(good_bundle):
    """One submission whoever awaits first; a Stop button's task (cancel, then wait) while another task iterates:
    both end, the pieces went to one or the other."""
    gen = load(good_bundle)
    submitted = []
    stream_of = gen.stream
    gen.stream = lambda *a, **kw: submitted.append(1) or stream_of(*a, **kw)

    async def main():
        both = gen.astream(PROMPTS[0], max_new_tokens=30, ignore_eos=True)
        first, second = await asyncio.gather(both.wait(), both.wait())
        stop = gen.astream(PROMPTS[1], max_new_tokens=200, ignore_eos=True, on_token=slowly)

        async def reader():
            async for _ in stop:
                await asyncio.sleep(0.001)

        reading = asyncio.create_task(reader())
        await asyncio.sleep(0.05)
        stop.cancel()
        stopped = await stop.wait()
        await reading
        return first, second, stopped

    first, second, stopped = run(main())
    assert first is second and len(first.tokens) == 30 and len(submitted) == 2
    assert stopped.stats.stop_reason == "cancelled" and len(stopped.tokens) < 200
    gen.close()


def test_an_error_is_raised_again_to_whoever_awaits_again(good_bundle):
    gen = load(good_bundle)
    stream = gen.astream("x", top_p=2)

    async def main():
        for _ in range(2):
            with pytest.raises(OptionError, match="top_p"):
                await stream.wait()

    run(main())
    gen.close()


def test_a_failed_first_async_call_leaves_a_synchronous_caller_running(good_bundle):
    """The first async call switches the generator to its worker thread; one refused before it is submitted must
    not leave a synchronous caller waiting for a worker that never started."""
    import threading

    gen = load(good_bundle)
    done = []
    caller = threading.Thread(target=lambda: done.append(gen.stream(
        PROMPTS[0], max_new_tokens=60, ignore_eos=True, on_token=slowly).wait()))
    caller.start()
    time.sleep(0.05)

    async def main():
        with pytest.raises(OptionError):
            await gen.agenerate("x", temperature=-1)

    run(main())
    caller.join(timeout=60)
    assert done and len(done[0].tokens) == 60
    gen.close()


def test_cancelling_while_the_request_is_submitted_cancels_it(good_bundle):
    """The submission runs in a thread (a first grammar takes a while): a task cancelled meanwhile still cancels
    the request once it is made, not only when its Stream happens to be freed."""
    gen = load(good_bundle)
    encode = gen.encode
    gen.encode = lambda *a, **kw: time.sleep(0.3) or encode(*a, **kw)

    async def main():
        stream = gen.astream(PROMPTS[0], max_new_tokens=200, ignore_eos=True, on_token=slowly)
        task = asyncio.create_task(stream.wait())
        await asyncio.sleep(0.05)                                   # inside the slow encode
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await stream.wait()

    result = run(main())
    assert result.stats.stop_reason == "cancelled" and len(result.tokens) < 200
    gen.close()
