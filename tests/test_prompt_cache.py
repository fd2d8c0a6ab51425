"""The prompt cache: a request whose prompt starts with what a free KV slot holds prefills only the rest, and its
tokens are exactly those of a run that prefilled everything (greedy and seeded sampling, each attention variant,
fp32 and int4, the target alone and with a draft)."""

import os
import random
import threading

import numpy as np
import pytest

import tiny_models as tm
from conftest import ARCHS, TARGET_ROWS, _export, together
from specedge.errors import OptionError, SpecedgeError
from specedge.runtime import load
from specedge.runtime.sequences import HeldText

FIRST_TEXT, MORE_TEXT, OTHER_TEXT = "def fib(n):\n    ", "\n# and now in C:\n", "import os\n"
GREEDY = dict(max_new_tokens=20, ignore_eos=True, k=3)
SAMPLED = dict(max_new_tokens=20, ignore_eos=True, k=3, temperature=0.9, top_p=0.95, seed=7)


def _ids(gen):
    return gen.encode(FIRST_TEXT), gen.encode(MORE_TEXT), gen.encode(OTHER_TEXT)


def _kv(model, slot: int, n: int) -> list:
    """Copies of a model's K/V of positions 0 .. n - 1 in a slot (cpu backend)."""
    return [buf[slot, :, :n].copy() for buf in (*model.keys, *model.values)]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def _follow_up_equals_fresh(gen, options):
    """Turn 1, then turn 2 = turn 1's text + more: turn 2 from the cache equals turn 2 after clearing it."""
    FIRST, MORE, _ = _ids(gen)
    first = gen.generate_ids(FIRST, **options)
    follow_up = FIRST + first.tokens + MORE
    cached = gen.generate_ids(follow_up, **options)
    # the first request's K/V covers its prompt and every generated token but the last (never fed)
    assert cached.stats.cached_prompt_tokens == len(FIRST) + len(first.tokens) - 1
    gen.clear_prompt_cache()
    fresh = gen.generate_ids(follow_up, **options)
    assert fresh.stats.cached_prompt_tokens == 0
    assert cached.tokens == fresh.tokens
    return cached


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_follow_up_from_the_cache_equals_a_fresh_run_gqa(arch_bundles, arch, options):
    gen = load(arch_bundles[arch])
    cached = _follow_up_equals_fresh(gen, options)
    assert cached.stats.n_drafted > 0                       # the draft took its cached prefix too
    gen.close()


@pytest.mark.parametrize("name", ["qwen2", "gpt2", "qwen2-int4"])
@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_follow_up_from_the_cache_equals_a_fresh_run_standard(standard_bundles, name, options):
    gen = load(standard_bundles[name], max_batch=2)
    _follow_up_equals_fresh(gen, {**options, "k": 0} if name == "gpt2" else options)
    gen.close()


def test_the_last_prompt_token_is_always_fed(standard_bundles):
    """The same prompt twice: all but its last token from the cache (its logits give the first new token)."""
    gen = load(standard_bundles["qwen2"])
    FIRST, _, _ = _ids(gen)
    first = gen.generate_ids(FIRST, **GREEDY)
    again = gen.generate_ids(FIRST, **GREEDY)
    assert again.stats.cached_prompt_tokens == len(FIRST) - 1
    assert again.tokens == first.tokens
    gen.close()


def test_a_prefix_held_by_another_free_slot_is_copied(standard_bundles):
    """Two requests end in slots 0 and 1 (the one in slot 1 first, so nothing moves); a follow-up of the one in
    slot 1 joins in slot 0 and copies its prefix from slot 1 (slot 1 keeps it)."""
    gen = load(standard_bundles["qwen2"], max_batch=3)
    FIRST, MORE, _ = _ids(gen)
    _, second = together(gen, [(OTHER_TEXT, dict(GREEDY, max_new_tokens=40, k=0)), (FIRST_TEXT, GREEDY)])
    assert gen.scheduler.cache.held[0] is not None
    held = gen.scheduler.cache.held[1]
    assert held is not None and held.tokens[: len(FIRST)].tolist() == FIRST
    follow_up = FIRST + second.tokens + MORE
    cached = gen.generate_ids(follow_up, **GREEDY)
    assert cached.stats.cached_prompt_tokens == len(FIRST) + len(second.tokens) - 1
    after = gen.scheduler.cache.held[1]                                # the copy left slot 1's text where it was
    assert after.tokens.tolist() == held.tokens.tolist() and after.stamp > held.stamp     # and it was used now
    n = len(follow_up) - 1                  # the prompt's K/V, all but the last token from the cache
    target_kv, draft_kv = _kv(gen.target, 0, n), _kv(gen.draft, 0, n)
    gen.clear_prompt_cache()
    assert gen.generate_ids(follow_up, **GREEDY).tokens == cached.tokens      # in slot 0 again, prefilled
    assert _same(_kv(gen.target, 0, n), target_kv) and _same(_kv(gen.draft, 0, n), draft_kv)
    gen.close()


def test_a_sequence_moved_by_compaction_leaves_a_usable_copy(standard_bundles):
    """A short request in slot 0 ends while a long one runs in slot 1: the long one moves to slot 0, and slot 1
    still holds its text so far, which a request joining meanwhile starts from."""
    gen = load(standard_bundles["qwen2"], max_batch=2)
    FIRST, MORE, OTHER = _ids(gen)
    short, long_ = (OTHER, dict(GREEDY, max_new_tokens=6, k=0)), (FIRST, dict(GREEDY, max_new_tokens=40))
    with gen.scheduler.wake:
        streams = [gen.stream_ids(short[0], **short[1]), gen.stream_ids(long_[0], **long_[1])]
    streams[0].wait()                                       # drives steps until the short one ends and leaves
    assert streams[1]._seq.slot == 0
    held = gen.scheduler.cache.held[1]
    assert held is not None and held.tokens[: len(FIRST)].tolist() == FIRST
    joining = gen.stream_ids(FIRST + MORE, **GREEDY)
    result, long_result = joining.wait(), streams[1].wait()
    assert result.stats.cached_prompt_tokens == len(FIRST)
    n = len(FIRST + MORE) - 1
    slot = next(j for j, held in enumerate(gen.scheduler.cache.held)   # where the joining request's text is
                if held is not None and held.tokens[: n + 1].tolist() == FIRST + MORE)
    target_kv = _kv(gen.target, slot, n)
    gen.clear_prompt_cache()
    assert gen.generate_ids(FIRST + MORE, **GREEDY).tokens == result.tokens
    assert _same(_kv(gen.target, 0, n), target_kv)
    assert gen.generate_ids(long_[0], **long_[1]).tokens == long_result.tokens
    gen.close()


def test_a_text_in_a_slot_compaction_fills_is_kept_in_a_free_slot(standard_bundles):
    """A request in slot 0 ends while another runs in slot 1: before the running one moves down into slot 0, the
    ended one's text is copied into free slot 2, and its follow-up (joining while the other still runs) starts
    from there, with K/V byte for byte a fresh prefill's."""
    gen = load(standard_bundles["qwen2"], max_batch=3)
    FIRST, MORE, OTHER = _ids(gen)
    with gen.scheduler.wake:
        streams = [gen.stream_ids(OTHER, **dict(GREEDY, max_new_tokens=6, k=0)),
                   gen.stream_ids(FIRST, **dict(GREEDY, max_new_tokens=60))]
    ended = streams[0].wait()
    assert streams[1]._seq.slot == 0 and gen.scheduler.cache.held[2].finished
    follow_up = OTHER + ended.tokens + MORE
    joining = gen.stream_ids(follow_up, **GREEDY)
    result = joining.wait()
    assert joining._seq.slot in (0, 1) and result.stats.cached_prompt_tokens == len(OTHER) + len(ended.tokens) - 1
    streams[1].wait()
    n = len(follow_up) - 1
    slot = next(j for j, held in enumerate(gen.scheduler.cache.held)
                if held is not None and held.tokens[: n + 1].tolist() == follow_up)
    target_kv, draft_kv = _kv(gen.target, slot, n), _kv(gen.draft, slot, n)
    gen.clear_prompt_cache()
    assert gen.generate_ids(follow_up, **GREEDY).tokens == result.tokens
    assert _same(_kv(gen.target, 0, n), target_kv) and _same(_kv(gen.draft, 0, n), draft_kv)
    gen.close()


def test_a_text_in_the_slot_a_new_request_takes_moves_to_a_free_slot(standard_bundles):
    """Client A's conversation ends in slot 0; client B's unrelated request takes slot 0, so A's text first moves
    to free slot 1, and A's next turn still starts from it."""
    gen = load(standard_bundles["qwen2"], max_batch=2)
    FIRST, MORE, OTHER = _ids(gen)
    a = gen.generate_ids(FIRST, **GREEDY)
    b = gen.generate_ids(OTHER, **GREEDY)
    assert b.stats.cached_prompt_tokens == 0 and gen.scheduler.cache.held[1].tokens.tolist() == (FIRST + a.tokens)[:-1]
    follow_up = FIRST + a.tokens + MORE
    cached = gen.generate_ids(follow_up, **GREEDY)
    assert cached.stats.cached_prompt_tokens == len(FIRST) + len(a.tokens) - 1
    n = len(follow_up) - 1
    target_kv, draft_kv = _kv(gen.target, 0, n), _kv(gen.draft, 0, n)
    gen.clear_prompt_cache()
    assert gen.generate_ids(follow_up, **GREEDY).tokens == cached.tokens
    assert _same(_kv(gen.target, 0, n), target_kv) and _same(_kv(gen.draft, 0, n), draft_kv)
    gen.close()


def test_a_moving_text_replaces_the_least_recently_used_one(standard_bundles):
    """Free slots 2 and 3 hold texts used at different times; the text of a request that ends in slot 0 while
    another runs in slot 1 must leave slot 0 (compaction fills it): it replaces the older of the two."""
    gen = load(standard_bundles["qwen2"], max_batch=4)
    sched = gen.scheduler
    FIRST, _, OTHER = _ids(gen)
    never = gen.vocab_size - 1                        # texts no prompt here starts with
    sched.cache.held[2] = HeldText(np.full(8, never), 0, finished=True, stamp=sched.cache._tick())
    sched.cache.held[3] = HeldText(np.full(9, never), 0, finished=True, stamp=sched.cache._tick())     # the more recent
    with sched.wake:
        streams = [gen.stream_ids(OTHER, **dict(GREEDY, max_new_tokens=4, k=0)),
                   gen.stream_ids(FIRST, **dict(GREEDY, max_new_tokens=40))]
    ended = streams[0].wait()
    assert sched.cache.held[2].tokens.tolist() == (OTHER + ended.tokens)[:-1] and len(sched.cache.held[3].tokens) == 9
    streams[1].wait()
    gen.close()


def test_a_failed_sequence_leaves_nothing_to_reuse(standard_bundles, monkeypatch):
    gen = load(standard_bundles["qwen2"])
    real_run = gen.target.run
    calls = {"n": 0}

    def failing_run(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return real_run(*args, **kwargs)

    monkeypatch.setattr(gen.target, "run", failing_run)
    FIRST, _, _ = _ids(gen)
    with pytest.raises(Exception, match="injected"):
        gen.generate_ids(FIRST, **GREEDY)
    monkeypatch.setattr(gen.target, "run", real_run)
    assert gen.scheduler.cache.held[0] is None
    assert gen.generate_ids(FIRST, **GREEDY).stats.cached_prompt_tokens == 0
    gen.close()


def test_the_cache_can_be_turned_off(standard_bundles):
    gen = load(standard_bundles["qwen2"], prompt_cache=False)
    FIRST, _, _ = _ids(gen)
    gen.generate_ids(FIRST, **GREEDY)
    assert gen.generate_ids(FIRST, **GREEDY).stats.cached_prompt_tokens == 0
    assert gen.counters.get("cached_prompt_tokens", 0) == 0
    gen.close()


@pytest.fixture(scope="module")
def chat_bundle(workdir):
    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    return _export(workdir, "cache-chat", target, tm.perturbed(target, seed=3, noise=0.01),
                   tm.byte_tokenizer(chat=True))


def test_a_conversation_prefills_only_its_new_turn(chat_bundle):
    gen = load(chat_bundle)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
    first = gen.chat(history, max_new_tokens=12, k=3)
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Again."}]
    second = gen.chat(history, max_new_tokens=12, k=3)
    assert second.stats.cached_prompt_tokens >= len(gen.encode_messages(history[:2])) - 1
    gen.clear_prompt_cache()
    assert gen.chat(history, max_new_tokens=12, k=3).tokens == second.tokens
    gen.close()


@pytest.mark.parametrize("messages, message", [
    ("hi", "messages must be a list"),
    ([], "messages is empty"),
    ([{"role": "robot", "content": "x"}], "role"),
    ([{"role": "user", "content": 3}], "content"),
    (["hi"], r"messages\[0\] must be a dict"),
])
def test_bad_messages_are_one_line_errors(chat_bundle, messages, message):
    gen = load(chat_bundle)
    with pytest.raises(OptionError, match=message):
        gen.chat(messages)
    gen.close()


# -- the invariant: every held text's K/V is, byte for byte, what a fresh prefill of its tokens writes ----------------
class HeldChecker:
    """Wraps the scheduler's iterations: after each one (however it ended), every held text is checked against a
    fresh prefill of its tokens in a separate backend (target: all of them, draft: the first draft_len)."""

    def __init__(self, gen):
        from specedge.runtime.backends import open_backend
        from specedge.runtime.backends.base import SlotCursor

        self.gen, self.cursor, self.fresh, self.violations, self.checked = gen, SlotCursor, {}, [], 0
        self.refs = {}
        for role, model in (("target", gen.target), ("draft", gen.draft)):
            if model is not None:
                entry = gen.manifest["models"][role]
                self.refs[role] = open_backend("cpu", gen.path / entry["file"], entry, gen.max_seq_len)
                self.refs[role].min_rows = model.min_rows
        inner = gen.scheduler._iterate

        def checked():
            try:
                inner()
            finally:
                self.check()
        gen.scheduler._iterate = checked

    def _expected(self, role: str, tokens: tuple) -> list:
        if (role, tokens) not in self.fresh:
            cursor = self.cursor(self.refs[role])
            cursor.feed(list(tokens))
            self.fresh[(role, tokens)] = _kv(self.refs[role], 0, len(tokens))
        return self.fresh[(role, tokens)]

    def check(self) -> None:
        running = {s.slot for s in self.gen.scheduler.running}
        for slot, held in enumerate(self.gen.scheduler.cache.held):
            if held is None:
                continue
            self.checked += 1
            tokens = tuple(held.tokens.tolist())
            if slot in running:
                self.violations.append((slot, "a running slot holds a text"))
            if not _same(_kv(self.gen.target, slot, len(tokens)), self._expected("target", tokens)):
                self.violations.append((slot, "target K/V"))
            d = held.draft_len
            if d and not _same(_kv(self.gen.draft, slot, d), self._expected("draft", tokens[:d])):
                self.violations.append((slot, "draft K/V"))


def test_a_shared_system_prompt_does_not_evict_another_conversation(standard_bundles):
    """B starts with the system prompt A's conversation holds: B takes that prefix, and A's whole conversation is
    first kept in a free slot, so A's next turn still starts from all of it."""
    gen = load(standard_bundles["qwen2"], max_batch=2)
    system = gen.encode("You are terse. " * 4)
    a_prompt, b_prompt = system + gen.encode("first question"), system + gen.encode("other question")
    a = gen.generate_ids(a_prompt, **GREEDY)
    b = gen.generate_ids(b_prompt, **GREEDY)
    assert b.stats.cached_prompt_tokens == len(system) + len(os.path.commonprefix(
        [gen.encode("first question"), gen.encode("other question")]))
    again = gen.generate_ids(a_prompt + a.tokens + gen.encode(MORE_TEXT), **GREEDY)
    assert again.stats.cached_prompt_tokens == len(a_prompt) + len(a.tokens) - 1
    gen.close()


@pytest.mark.parametrize("failure", [RuntimeError("device copy failed"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
@pytest.mark.parametrize("model", ["target", "draft"])
def test_a_copy_that_fails_part_way_leaves_no_false_text(standard_bundles, failure, model):
    """A text being copied into a free slot when the copy fails after its first layer: that slot must not still
    claim its old text (whose K/V is now partly overwritten); a later follow-up of the old text is exact."""
    gen = load(standard_bundles["qwen2"], max_batch=2)
    checker = HeldChecker(gen)
    FIRST, MORE, OTHER = _ids(gen)
    a = gen.generate_ids(FIRST, **GREEDY)                   # A's text in slot 0
    gen.generate_ids(OTHER, **GREEDY)                       # B takes slot 0; A's text moves to free slot 1
    backend = getattr(gen, model)
    real = backend.move_slot

    def fails_after_one_layer(src, dst, length):
        backend.keys[0][dst, :, :length] = backend.keys[0][src, :, :length]
        raise failure

    backend.move_slot = fails_after_one_layer
    with pytest.raises((RuntimeError, KeyboardInterrupt, Exception)):
        gen.generate_ids(gen.encode("zzz"), **GREEDY)         # C takes slot 0: B's text is copied over slot 1
    backend.move_slot = real
    follow_up = FIRST + a.tokens + MORE
    cached = gen.generate_ids(follow_up, **GREEDY)
    gen.clear_prompt_cache()
    assert gen.generate_ids(follow_up, **GREEDY).tokens == cached.tokens
    assert checker.checked > 0 and checker.violations == []
    gen.close()


def test_ctrl_c_during_compaction_records_nothing_false_and_the_next_step_finishes_the_moves(standard_bundles):
    gen = load(standard_bundles["qwen2"], max_batch=3)
    checker = HeldChecker(gen)
    FIRST, MORE, OTHER = _ids(gen)
    real, moves = gen.draft.move_slot, []

    def interrupted_once(src, dst, length):
        real(src, dst, length)
        moves.append((src, dst))
        if (src, dst) == (1, 0) and len([m for m in moves if m == (1, 0)]) == 1:
            raise KeyboardInterrupt

    gen.draft.move_slot = interrupted_once
    with gen.scheduler.wake:
        short = gen.stream_ids(OTHER, **dict(GREEDY, max_new_tokens=6, k=0))
        long_ = gen.stream_ids(FIRST, **dict(GREEDY, max_new_tokens=40))
    with pytest.raises(KeyboardInterrupt):
        short.wait()
    result = long_.wait()                                   # its steps go on: the move is finished first
    assert [s.slot for s in gen.scheduler.running] == [] and moves.count((1, 0)) == 2
    gen.draft.move_slot = real
    gen.clear_prompt_cache()
    assert gen.generate_ids(FIRST, **dict(GREEDY, max_new_tokens=40)).tokens == result.tokens
    assert checker.checked > 0 and checker.violations == []
    gen.close()


@pytest.mark.parametrize("options", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_requests_sharing_a_prompt_at_once_prefill_it_once(standard_bundles, options):
    """n choices of one request, or clients with one system prompt, arriving together: the first prefills the shared
    prompt, the others wait for that and copy it from its slot, with the tokens of runs that prefilled everything."""
    gen = load(standard_bundles["qwen2"], max_batch=3)
    texts = ["You answer. " * 8 + tail for tail in ("def f(x):", "def f(x):", "class B:")]
    shared, prompts = gen.encode(texts[0][:96]), [gen.encode(text) for text in texts]
    assert len(shared) > 64                                         # more than the first prefill chunk
    results = together(gen, [(text, options) for text in texts])
    cached = [r.stats.cached_prompt_tokens for r in results]
    assert cached[0] == 0 and all(c >= len(shared) for c in cached[1:]), cached
    chunks = gen.counters["prefill_chunks"]
    assert chunks == -(-len(prompts[0]) // 64) + 2, chunks          # the shared part once, then each one's rest
    for prompt, result in zip(prompts, results):
        gen.clear_prompt_cache()
        assert gen.generate_ids(prompt, **options).tokens == result.tokens
    gen.close()


def test_a_request_waiting_for_a_shared_prefill_keeps_its_place(standard_bundles):
    """First come, first served: while W waits for R's prefill, X (behind it, unrelated) waits too; W then takes
    R's prefix (before, X took the free slot, and R's text was lost when it left a full batch)."""
    gen = load(standard_bundles["qwen2"], max_batch=2)
    shared = "You answer. " * 8
    texts = [shared + "def f(x):" + " pass" * 10, shared + "class B:", "import os\n"]
    order = []
    with gen.scheduler.wake:
        streams = [gen.stream(text, max_new_tokens=6, ignore_eos=True, k=3,
                              on_token=lambda ids, piece, i=i: order.append(i)) for i, text in enumerate(texts)]
    results = [s.wait() for s in streams]
    assert results[1].stats.cached_prompt_tokens >= len(gen.encode(shared))
    assert order.index(1) < order.index(2)           # W's first token before X's
    gen.close()


def test_many_requests_at_once_keep_the_invariant_and_their_solo_outputs(standard_bundles):
    """Threads sending prompts that share starts, follow-ups of earlier answers, cancellations: after every
    iteration every held text's K/V equals a fresh prefill's, and every finished greedy request's tokens equal its
    run alone with no cache."""
    gen = load(standard_bundles["qwen2"], max_batch=3)
    checker = HeldChecker(gen)
    rng = random.Random(5)
    stems = [gen.encode(t) for t in ("def f(x):\n", "class A:\n    ", "import os\n", "def f(y):\n")]
    done, lock = [], threading.Lock()

    def client(i: int) -> None:
        history = list(stems[i % len(stems)])
        for turn in range(3):
            options = dict(GREEDY, max_new_tokens=rng.randint(3, 14), k=rng.choice([0, 2, 4]))
            stream = gen.stream_ids(history, **options)
            if rng.random() < 0.2:
                next(iter(stream), None)
                stream.cancel()
                stream.wait()
                continue
            result = stream.wait()
            with lock:
                done.append((list(history), options, result.tokens))
            history = history + result.tokens + stems[(i + turn) % len(stems)]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert checker.checked > 0 and checker.violations == []
    assert gen.counters["cached_prompt_tokens"] > 0
    gen.clear_prompt_cache()
    for prompt, options, tokens in done:
        gen.clear_prompt_cache()
        assert gen.generate_ids(prompt, **options).tokens == tokens
    gen.close()


def test_clear_prompt_cache_inside_a_callback_is_an_error_not_a_hang(standard_bundles):
    gen = load(standard_bundles["qwen2"])
    errors = []

    def on_token(ids, text):
        try:
            gen.clear_prompt_cache()
        except SpecedgeError as err:
            errors.append(err)

    gen.stream_ids(gen.encode("hi"), on_token=on_token, **GREEDY).wait()
    assert errors and "on_token" in str(errors[0])
    gen.close()


def test_the_cache_is_on_only_where_it_is_exact(standard_bundles, monkeypatch):
    assert load(standard_bundles["qwen2"]).prompt_cache is True
    on_cpu = {"device": "cpu"}                              # the cuda backend's code on the CPU provider
    assert load(standard_bundles["qwen2"], backend="cuda", backend_options=on_cpu).prompt_cache is False
    with pytest.raises(OptionError, match="not be exact here: not verified on the cuda backend"):
        load(standard_bundles["qwen2"], backend="cuda", backend_options=on_cpu, prompt_cache=True)
    # a CPU whose one-row kernel differs (auto picks two rows there), forced to one row
    monkeypatch.setattr("specedge.runtime.generator.choose_min_rows", lambda *a, **k: 2)
    assert load(standard_bundles["qwen2"], target_rows=1).prompt_cache is False
    with pytest.raises(OptionError, match="target_rows=1"):
        load(standard_bundles["qwen2"], target_rows=1, prompt_cache=True)


def test_the_demo_s_conversation_takes_its_second_turn_from_the_cache(chat_bundle, capsys):
    from specedge.demo import _conversation

    gen = load(chat_bundle)
    _conversation(gen, "def f(x):\n    return x + 1\n", dict(max_new_tokens=8, k=2))
    lines = [line for line in capsys.readouterr().out.splitlines() if "of them from the cache" in line]
    cached = [int(line.split(" tokens, ")[1].split(" of them")[0]) for line in lines]
    assert len(cached) == 2 and cached[0] == 0 and cached[1] > 50
    gen.close()


def test_several_clients_next_turns_at_once_each_reuse_their_own_conversation(standard_bundles):
    """Three conversations run at once (their texts end up in different slots as they finish and the others move
    down); their next turns arrive together in another order, and each takes its own conversation from the cache
    (in place where its text is in a joining slot, copied from a free slot otherwise), exactly."""
    gen = load(standard_bundles["qwen2"], max_batch=4)
    checker = HeldChecker(gen)
    _, MORE, _ = _ids(gen)
    prompts = ["def fib(n):\n", "class Stack:\n    ", "import os\nimport sys\n"]
    lengths = [20, 12, 28]                                  # they finish at different steps
    first = together(gen, [(p, dict(GREEDY, max_new_tokens=n)) for p, n in zip(prompts, lengths)])
    follow_ups = [gen.encode(p) + r.tokens + MORE for p, r in zip(prompts, first)]
    with gen.scheduler.wake:
        streams = [gen.stream_ids(follow_ups[i], **GREEDY) for i in (2, 0, 1)]
    results = {i: s.wait() for i, s in zip((2, 0, 1), streams)}
    for i, r in results.items():
        assert r.stats.cached_prompt_tokens == len(gen.encode(prompts[i])) + lengths[i] - 1, i
    assert checker.violations == []
    for i, r in results.items():
        gen.clear_prompt_cache()
        assert gen.generate_ids(follow_ups[i], **GREEDY).tokens == r.tokens
    gen.close()


def test_a_request_shares_a_running_request_s_prompt_start(standard_bundles):
    """A request arriving while another runs with the same system prompt copies that prefix from the running
    request's slot (its committed text) instead of prefilling it, exactly."""
    gen = load(standard_bundles["qwen2"], max_batch=2)
    checker = HeldChecker(gen)
    system = gen.encode("You are terse and exact. " * 3)
    first, second = system + gen.encode("first question"), system + gen.encode("second one")
    running = gen.stream_ids(first, **dict(GREEDY, max_new_tokens=40))
    next(iter(running))                                  # it has prefilled and committed its first token
    joined = gen.generate_ids(second, **GREEDY)
    running.wait()
    shared = len(os.path.commonprefix([first, second]))
    assert joined.stats.cached_prompt_tokens == shared
    gen.clear_prompt_cache()
    assert gen.generate_ids(second, **GREEDY).tokens == joined.tokens
    assert checker.violations == []
    gen.close()
