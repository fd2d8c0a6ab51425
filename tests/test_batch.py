"""Runtime v2: sequences in one batch get exactly their solo tokens; threads, cancellation, queue, errors."""

import json
import shutil
import threading

import pytest

import tiny_models as tm
from conftest import ARCHS, TARGET_ROWS, _export, together
from specedge.errors import BundleError, OptionError, SpecedgeError
from specedge.runtime import QueueFull, load

# prompts of different lengths (one longer than a prefill chunk), and different lengths to generate, so rows
# carry different k caps and leave the batch at different steps (slots get compacted)
PROMPTS = ["def f(x):", "class LRUCache:\n    def __init__(self):\n", "x" * 70 + " = 1\n", "import os\n"]
NEW_TOKENS = [12, 40, 25, 33]


@pytest.fixture(scope="module")
def batch_bundles(workdir, standard_bundles):
    """Per architecture: a target and a perturbed copy as draft (accepts often), batched attention."""
    tok = tm.byte_tokenizer()
    bundles = {"qwen2": standard_bundles["qwen2"], "qwen2-int4": standard_bundles["qwen2-int4"]}
    for arch in ARCHS[1:]:
        target = tm.make_model(arch, TARGET_ROWS, seed=1)
        bundles[arch] = _export(workdir, f"{arch}-batch", target, tm.perturbed(target, seed=3, noise=0.02), tok,
                                attention="standard")
    return bundles


def _requests(sampled: bool):
    requests = []
    for i, (prompt, n) in enumerate(zip(PROMPTS, NEW_TOKENS)):
        options = dict(max_new_tokens=n, ignore_eos=True, k=[4, 2, 8, 3][i])
        if sampled and i % 2:
            options.update(temperature=0.8, top_p=0.95, seed=i)
        requests.append((prompt, options))
    return requests


def _check_batch_equals_solo(bundle, sampled):
    gen = load(bundle, max_batch=4)
    requests = _requests(sampled)
    solo = [gen.generate(prompt, **options).tokens for prompt, options in requests]
    batched = together(gen, requests)
    assert [r.tokens for r in batched] == solo
    assert max(e.batch for e in gen.events) >= 3                  # rows really shared calls
    assert sum(r.stats.n_verify for r in batched) > 0
    gen.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_rows_in_a_batch_equal_their_solo_runs(batch_bundles, arch):
    _check_batch_equals_solo(batch_bundles[arch], sampled=False)


def test_seeded_sampled_and_greedy_rows_mixed_equal_their_solo_runs(batch_bundles):
    _check_batch_equals_solo(batch_bundles["qwen2"], sampled=True)


@pytest.mark.parametrize("sampled", [False, True])
def test_int4_rows_in_a_batch_equal_their_solo_runs(batch_bundles, sampled):
    _check_batch_equals_solo(batch_bundles["qwen2-int4"], sampled)


def test_batched_greedy_speculation_equals_target_only(batch_bundles):
    gen = load(batch_bundles["llama"], max_batch=4)
    target_only = [gen.generate(p, max_new_tokens=n, ignore_eos=True, use_draft=False).tokens
                   for p, n in zip(PROMPTS, NEW_TOKENS)]
    batched = together(gen, [(p, dict(max_new_tokens=n, ignore_eos=True, policy="adaptive"))
                              for p, n in zip(PROMPTS, NEW_TOKENS)])
    assert [r.tokens for r in batched] == target_only


@pytest.mark.parametrize("background", [False, True])
def test_threads_get_their_solo_outputs_in_fewer_target_calls(batch_bundles, background):
    """Callers drive the batch themselves by default, a worker thread with background=True: the same tokens."""
    gen = load(batch_bundles["qwen2"], max_batch=4, background=background)
    options = dict(max_new_tokens=30, ignore_eos=True, k=4)
    solo = [gen.generate(p, **options) for p in PROMPTS]
    solo_calls = sum(r.stats.n_target_calls for r in solo)
    before = gen.counters["target_calls"]
    out = [None] * 4
    start = threading.Barrier(4)

    def worker(i):
        start.wait()
        out[i] = gen.generate(PROMPTS[i], **options)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [r.tokens for r in out] == [r.tokens for r in solo]
    assert gen.counters["target_calls"] - before < solo_calls        # batched, not serialised


def test_cancelling_a_stream_frees_its_slot(batch_bundles):
    gen = load(batch_bundles["qwen2"], max_batch=2, max_queue=1)
    long = dict(max_new_tokens=200, ignore_eos=True, k=2)
    first, second = gen.stream(PROMPTS[0], **long), gen.stream(PROMPTS[1], **long)
    next(iter(first))                                                  # running
    third = gen.stream(PROMPTS[2], max_new_tokens=5, ignore_eos=True)  # waits for a slot
    first.cancel()
    assert len(third.wait().tokens) == 5                               # ran in the freed slot
    assert first.wait().stats.stop_reason == "cancelled"
    assert len(first.tokens) < 200
    rest = second.wait()
    assert rest.tokens == gen.generate(PROMPTS[1], **long).tokens      # undisturbed by the move into slot 0


def test_closing_the_iterator_cancels(batch_bundles):
    """close(), cancel() and a with block's end cancel without waiting (any thread may call them, whatever locks it
    holds); wait() then has the result (README)."""
    gen = load(batch_bundles["qwen2"], max_batch=1, max_queue=0)
    stream = gen.stream(PROMPTS[0], max_new_tokens=200, ignore_eos=True)
    for _ in stream:
        break
    stream.close()
    assert stream.result is None and stream.wait().stats.stop_reason == "cancelled"
    with gen.stream(PROMPTS[1], max_new_tokens=200, ignore_eos=True) as inside:
        next(inside)
    assert inside.wait().stats.stop_reason == "cancelled" and len(inside.result.tokens) < 200
    with pytest.raises(KeyError), gen.stream(PROMPTS[1], max_new_tokens=200, ignore_eos=True) as failing:
        next(failing)
        raise KeyError("the caller's own error leaves at once")
    assert failing.wait().stats.stop_reason == "cancelled"
    assert len(gen.generate(PROMPTS[1], max_new_tokens=4, ignore_eos=True).tokens) == 4


def test_a_full_queue_is_a_clear_error(batch_bundles):
    gen = load(batch_bundles["qwen2"], max_batch=1, max_queue=1)
    with gen.scheduler.wake:                                           # nothing is admitted while we hold it
        running = gen.stream(PROMPTS[0], max_new_tokens=40, ignore_eos=True)
        queued = gen.stream(PROMPTS[1], max_new_tokens=4, ignore_eos=True)
        with pytest.raises(QueueFull, match="queue is full"):
            gen.stream(PROMPTS[2], max_new_tokens=4)
    assert len(running.wait().tokens) == 40 and len(queued.wait().tokens) == 4


def test_a_request_that_does_not_fit_leaves_the_others_alone(batch_bundles):
    gen = load(batch_bundles["qwen2"], max_batch=2)
    expected = gen.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True).tokens
    running = gen.stream(PROMPTS[1], max_new_tokens=30, ignore_eos=True)
    with pytest.raises(SpecedgeError, match="max_seq_len 256 leaves no room"):
        gen.stream("y" * 300)
    assert running.wait().tokens == expected


def test_on_token_sees_every_committed_token_in_order(batch_bundles):
    gen = load(batch_bundles["qwen2"])
    seen, text = [], []
    result = gen.stream(PROMPTS[0], max_new_tokens=20, ignore_eos=True,
                        on_token=lambda ids, piece: (seen.extend(ids), text.append(piece))).wait()
    assert seen == result.tokens and "".join(text) == result.text


def test_a_one_row_variant_refuses_batches(arch_bundles):
    with pytest.raises(OptionError, match="--attention standard"):
        load(arch_bundles["qwen2"], max_batch=2)


def test_kv_per_slot_is_reported(batch_bundles):
    gen = load(batch_bundles["qwen2"], max_batch=3)
    entry = gen.manifest["models"]["target"]["kv"]
    assert gen.kv_slot_bytes["target"] == 2 * entry["num_layers"] * entry["num_kv_heads"] * entry["slots"] * entry["head_dim"] * 4
    assert gen.target.keys[0].shape[0] == 3


def test_a_max_batch_beyond_the_machine_s_memory(batch_bundles, monkeypatch, capsys, tmp_path, caplog):
    """More KV than the machine's memory is a warning (pages come as sequences fill the slots, so short sequences
    run); a size that cannot be allocated is a one-line error, not numpy's MemoryError traceback."""
    import specedge.runtime.backends.cpu as cpu

    gen = load(batch_bundles["qwen2"], max_batch=2)
    slot = gen.kv_slot_bytes["target"]
    with pytest.raises(OptionError, match=r"KV buffers for max_batch 10000000000 take .* \(.* a slot\), which "
                                          r"could not be allocated; lower --max-batch"):
        load(batch_bundles["qwen2"], max_batch=10_000_000_000)
    monkeypatch.setattr(cpu, "_physical_memory", lambda: 3 * slot)        # a machine smaller than 4 slots
    small = load(batch_bundles["qwen2"], max_batch=4)
    assert small.generate(PROMPTS[0], max_new_tokens=3, ignore_eos=True).stats.new_tokens == 3
    assert any("max_batch 4 take" in r.getMessage() and "more than this machine's" in r.getMessage()
               for r in caplog.records)
    monkeypatch.setattr(cpu.np, "zeros", lambda *a, **k: (_ for _ in ()).throw(MemoryError("no")))
    with pytest.raises(OptionError, match=f"max_batch 3 take {3 * slot / 2**20:.1f} MiB .*could not be allocated"):
        load(batch_bundles["qwen2"], max_batch=3)
    monkeypatch.undo()
    from specedge.cli import main

    assert main(["bench", str(batch_bundles["qwen2"]), "--batch", "1,10000000000", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "KV buffers for max_batch 10000000000" in err and len(err.strip().splitlines()) == 1, err


def test_unknown_and_unavailable_backends_are_one_line_errors(batch_bundles, monkeypatch):
    with pytest.raises(OptionError, match=r"unknown backend 'tpu' \(available: cpu\)"):
        load(batch_bundles["qwen2"], backend="tpu")
    from specedge.runtime import backends

    monkeypatch.setitem(backends.BACKENDS, "cuda", ("specedge_no_such_module", "CudaBackend", "onnxruntime-gpu"))
    with pytest.raises(OptionError, match=r"backend 'cuda' is not available: needs onnxruntime-gpu"):
        load(batch_bundles["qwen2"], backend="cuda")


@pytest.fixture
def bundle_copy(batch_bundles, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(batch_bundles["gpt2"], dst)
    return dst


def _edit_manifest(bundle, edit):
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_manifest_that_lies_about_an_input_is_refused(bundle_copy):
    def rename(manifest):
        io = manifest["models"]["target"]["io"]
        io["inputs"]["token_ids"] = io["inputs"].pop("input_ids")
    _edit_manifest(bundle_copy, rename)
    with pytest.raises(BundleError, match="input_ids"):
        load(bundle_copy)


def test_a_manifest_that_lies_about_a_dtype_is_refused(bundle_copy):
    _edit_manifest(bundle_copy, lambda m: m["models"]["draft"]["io"]["inputs"]["position_ids"].update(dtype="float32"))
    with pytest.raises(BundleError, match="position_ids is tensor\\(int64\\) in the graph but float32"):
        load(bundle_copy)


def _heads(manifest, n):
    """Every KV size of the target, in spec, kv and each KV input and output, set to n heads: the manifest agrees
    with itself and not with the graph."""
    model = manifest["models"]["target"]
    model["kv"]["num_kv_heads"] = model["spec"]["num_kv_heads"] = n
    for names in model["io"]["kv"]:
        for name in names:
            side = model["io"]["inputs"] if name in model["io"]["inputs"] else model["io"]["outputs"]
            side[name]["shape"][1] = n


@pytest.mark.parametrize("edit, says", [
    (lambda m: m["models"]["target"].pop("spec"), "target model entry lacks 'spec'"),
    (lambda m: m["models"]["draft"].update(weight_bytes="big"), "integer 'weight_bytes'"),
    (lambda m: m["models"]["target"]["kv"].update(dtype="float64"), "kv dtype 'float64' is unknown"),
    (lambda m: m["models"]["target"]["kv"].update(dtype="float16"), "kv dtype float16 but the bundle's dtype"),
    (lambda m: m.update(eos_token_ids=[]), "eos_token_ids must be a non-empty list"),
    (lambda m: m["tokenizer"].update(file="../tokenizer.json"), "must name files in the bundle's folder"),
    (lambda m: m["models"]["target"]["kv"].update(num_kv_heads=3), r"past_key.0 is \[4, \d+, \d+\] a row, kv says"),
    (lambda m: _heads(m, 3), r"past_key.0 is \['batch', 4, \d+, \d+\] in the graph but \['batch', 3,"),
])
def test_a_hand_edited_manifest_is_one_line_at_load_not_a_crash_in_a_step(bundle_copy, edit, says):
    _edit_manifest(bundle_copy, edit)
    with pytest.raises(BundleError, match=says):
        load(bundle_copy)


def test_a_bundle_with_a_lighter_draft_head_asks_for_a_re_export(bundle_copy):
    """--draft-vocab was removed (not shown to pay): bundles made with it are refused, with what to do."""
    _edit_manifest(bundle_copy, lambda m: m["models"]["target"].update(vocab_subset={"file": "x", "size": 4}))
    with pytest.raises(BundleError, match="lighter LM head .* re-export the bundle without --draft-vocab"):
        load(bundle_copy)


def test_a_version_2_bundle_still_loads(bundle_copy):
    _edit_manifest(bundle_copy, lambda m: m.update(format_version=2))
    assert load(bundle_copy).generate("x", max_new_tokens=2, ignore_eos=True).stats.new_tokens == 2


def test_a_version_1_bundle_asks_for_a_re_export(bundle_copy):
    _edit_manifest(bundle_copy, lambda m: m.update(format_version=1))
    with pytest.raises(BundleError, match="version 1 is not supported .* re-export"):
        load(bundle_copy)


@pytest.fixture(scope="module")
def bad_batch_bundle(workdir):
    """A target and an independent random draft (rarely right), batched attention."""
    return _export(workdir, "llama-standard-bad", tm.make_model("llama", TARGET_ROWS, seed=1),
                   tm.make_model("llama", TARGET_ROWS, seed=2), tm.byte_tokenizer(), attention="standard")


def test_every_step_leaves_a_record(bad_batch_bundle):
    """B, k per row, accepted per row, predicted accepted (adaptive), each row's first rejection with both
    tokens and, when sampling, both probabilities; the records add up to the per-request stats."""
    gen = load(bad_batch_bundle, max_batch=2)
    results = together(gen, [(PROMPTS[0], dict(max_new_tokens=40, ignore_eos=True, policy="fixed:3")),
                              (PROMPTS[1], dict(max_new_tokens=40, ignore_eos=True, policy="fixed:3",
                                                temperature=1.0, seed=5))])
    events = gen.events
    assert sum(sum(e.k) for e in events) == sum(r.stats.n_drafted for r in results)
    assert sum(sum(e.accepted) for e in events) == sum(r.stats.n_accepted for r in results)
    assert {e.batch for e in events} >= {2} and all(len(e.k) == e.batch == len(e.accepted) for e in events)
    rejections = [r for e in events for r in e.rejections]
    assert sum(r.stats.n_verify for r in results) - sum(
        1 for e in events for k, n in zip(e.k, e.accepted) if k and n == k) == len(rejections)
    assert all(r["draft_token"] != r["target_token"] for r in rejections)
    sampled = [r for r in rejections if "p_draft" in r]
    assert sampled and all(0 <= r["p_draft"] < r["q_draft"] <= 1 for r in sampled)   # rejected: p/q < 1
    assert all(e.draft_s >= 0 and e.verify_s > 0 and e.model_s > 0 and e.verify_tokens >= e.batch for e in events)
    assert all(e.predicted is None for e in events)                # fixed k predicts nothing
    before = len(gen.events)
    gen.generate(PROMPTS[2], max_new_tokens=20, ignore_eos=True, policy="adaptive")
    assert all(e.predicted is not None and e.predicted >= 0 for e in gen.events[before:])


def test_a_probe_costs_one_row_and_stops_where_even_perfect_acceptance_cannot_pay(bad_batch_bundle):
    """With a useless draft adaptive switches off for the batch; its probes (k = 1) go to one row, two while the
    draft has been timed at one row count only. On the tiny pair the draft costs about what the target does, so
    once a probe has measured verifying 2 tokens a row at B = 3, not even a draft accepted every time could pay
    there: the policy waits its longest gap, and the 120 tokens end without another probe."""
    gen = load(bad_batch_bundle, max_batch=3)
    together(gen, [(p, dict(max_new_tokens=120, ignore_eos=True, policy="adaptive")) for p in PROMPTS[:3]])
    policy = gen.shared_policy("adaptive")
    probes = [e for e in gen.events if e.batch == 3 and max(e.k)]
    assert 1 <= len(probes) <= 2, [e.k for e in probes]
    assert all(sum(1 for k in e.k if k) <= 2 for e in probes), [e.k for e in probes]
    assert all(sum(1 for k in e.k if k) == 1 for e in probes[1:]), [e.k for e in probes]
    assert policy.costs.measured(3, 2) and policy.probe_gap(3) == policy.max_probe_gap


def test_an_engine_left_empty_tells_its_shared_policies(bad_batch_bundle):
    """Two requests at once, then none: the adaptive policy hears that the load fell to nothing, so the next lone
    request is a stretch that grew (what feeding its prompt can earn is not capped by the drain before it)."""
    gen = load(bad_batch_bundle, max_batch=2)
    together(gen, [(p, dict(max_new_tokens=6 + 4 * i, ignore_eos=True, policy="adaptive"))
                   for i, p in enumerate(PROMPTS[:2])])               # the longer one ends alone: a drain at B = 1
    clock = gen.shared_policy("adaptive").stretches
    assert clock.batch == 0 and not clock.shrunk and 1 in clock.mean_steps
    learned = dict(clock.mean_steps)
    gen.generate(PROMPTS[2], max_new_tokens=4, ignore_eos=True, policy="adaptive")
    assert clock.batch == 0 and clock.mean_steps == learned         # a stretch that grew is not learned
    clock.tick(1)                                                     # as if the engine had not emptied
    together(gen, [(PROMPTS[0], dict(max_new_tokens=4, ignore_eos=True, policy="adaptive")),
                   (PROMPTS[1], dict(max_new_tokens=16, ignore_eos=True, policy="target"))])
    assert clock.batch == 0                                  # the last to end was not adaptive's: told all the same


def _joined_while_off(gen, prompt, max_new_tokens):
    """Starts a request while the shared adaptive policy is off, then turns speculation on at k = 3."""
    gen.generate(PROMPTS[0], max_new_tokens=4, ignore_eos=True, policy="adaptive")   # creates the shared policy
    policy = gen.shared_policy("adaptive")
    policy.off, policy.since_probe, policy.probe_gaps = True, {}, {1: 10**6}   # as if a useless draft had been seen
    policy.last_batch = 1
    draft_calls = gen.counters.get("draft_calls", 0)
    stream = gen.stream(prompt, max_new_tokens=max_new_tokens, ignore_eos=True, policy="adaptive")
    next(iter(stream))                                                 # prefilled, first token committed
    assert gen.counters.get("draft_calls", 0) == draft_calls          # the draft was not fed the prompt
    assert stream._seq.dft_pos == 0
    policy.off = False
    policy.next_k = lambda max_k, batch=1, drafting=None, rows=None, rows_fed=False: min(3, max_k)
    return stream


def test_while_speculation_is_off_the_draft_is_not_fed_and_catches_up_a_chunk_a_step(batch_bundles):
    """A request that joins while the shared adaptive policy is off prefills the target only; once speculation is
    on again, beside another row its draft catches up at most one chunk per step (that row stalls no longer), and
    the output is still the target's own."""
    gen = load(batch_bundles["qwen2"], max_batch=2)
    prompt = "y" * 100 + " = 2\n"                                    # two chunks of catch-up
    expected = gen.generate(prompt, max_new_tokens=140, ignore_eos=True, policy="target").tokens
    gen.generate(PROMPTS[0], max_new_tokens=4, ignore_eos=True, policy="adaptive")   # creates the shared policy
    policy = gen.shared_policy("adaptive")
    policy.off, policy.since_probe, policy.probe_gaps, policy.last_batch = True, {}, {2: 10**6}, 2
    with gen.scheduler.wake:
        other = gen.stream(PROMPTS[1], max_new_tokens=200, ignore_eos=True, policy="target")
        stream = gen.stream(prompt, max_new_tokens=140, ignore_eos=True, policy="adaptive")
    next(iter(stream))                                                 # both prefilled, first token committed
    assert stream._seq.dft_pos == 0                                    # the draft was not fed the prompt
    policy.off = False
    policy.next_k = lambda max_k, batch=1, drafting=None, rows=None, rows_fed=False: min(3, max_k)
    events_before = len(gen.events)
    assert stream.wait().tokens == expected
    other.wait()
    catching = [e for e in gen.events[events_before:] if e.catch_up_s > 0]
    assert len(catching) == 2                                          # 106 tokens behind: a chunk of 64, then the rest
    assert catching[0].batch == 2 and catching[0].draft_calls == 0    # still behind after one chunk: sits out
    assert any(max(e.k) for e in gen.events[events_before:])          # and then it drafted


def test_a_lone_row_catches_up_all_at_once_and_drafts_in_the_same_step(batch_bundles):
    """Alone, no other row waits on a catch-up: the draft takes every missing chunk in one step and drafts."""
    catching = [e for e in _steps_after_joining_while_off(batch_bundles, 140) if e.catch_up_s > 0]
    assert len(catching) == 1 and catching[0].catch_up_tokens > 64 and catching[0].draft_calls > 0


def _steps_after_joining_while_off(batch_bundles, max_new_tokens: int) -> list:
    """A lone request of a 106-token prompt joins while adaptive is off, then speculation is on: -> its steps
    (its output checked against the target's own)."""
    gen = load(batch_bundles["qwen2"], max_batch=2)
    prompt = "y" * 100 + " = 2\n"
    expected = gen.generate(prompt, max_new_tokens=max_new_tokens, ignore_eos=True, policy="target").tokens
    stream = _joined_while_off(gen, prompt, max_new_tokens)
    events_before = len(gen.events)
    assert stream.wait().tokens == expected
    return gen.events[events_before:]


def test_a_draft_too_far_behind_for_the_tokens_left_does_not_catch_up(batch_bundles):
    """Catching up costs about a prefill of what the draft lacks: with fewer tokens to go than that, the row
    does not draft at all (and its output is still the target's)."""
    assert all(e.draft_calls == 0 and max(e.k) == 0 for e in _steps_after_joining_while_off(batch_bundles, 30))


def test_a_prompt_goes_to_the_draft_only_where_the_tokens_asked_repay_feeding_it(batch_bundles):
    """Feeding the draft a prompt costs about a draft prefill of it (timed, and learned as what feeding a draft
    that many tokens costs); where the tokens asked would not repay it (on the int4 pair a draft prefill is half the
    target's, and at B = 2 speculating saved less than that over 64 tokens) the draft is not fed, the row does
    not draft, and its output is still the target's."""
    gen = load(batch_bundles["qwen2"], max_batch=2)
    prompt = "y" * 100 + " = 2\n"
    expected = gen.generate(prompt, max_new_tokens=20, ignore_eos=True, policy="target").tokens
    gen.generate(PROMPTS[0], max_new_tokens=16, ignore_eos=True, policy="adaptive")   # creates the shared policy
    policy = gen.shared_policy("adaptive")
    assert policy.catch_up.calls                                      # the prompt fed to the draft was timed
    asked = []
    policy.speculates_at = lambda batch: True                          # speculation would win: only the cost decides
    policy.catch_up_pays = lambda behind, remaining, batch=None, unfed=1: asked.append((behind, remaining)) and False
    draft_calls = gen.counters.get("draft_calls", 0)
    gen.clear_prompt_cache()                               # the whole prompt to prefill (a free slot holds it)
    stream = gen.stream(prompt, max_new_tokens=20, ignore_eos=True, policy="adaptive")
    assert stream.wait().tokens == expected
    assert stream._seq.dft_pos == 0 and gen.counters.get("draft_calls", 0) == draft_calls
    assert asked[0] == (len(stream._seq.prompt_ids), 20)


@pytest.mark.parametrize("pays", [False, True])
def test_a_prompt_is_weighed_against_the_other_drafts_that_lack_their_text(batch_bundles, pays):
    """Speculating saves the whole batch's wall time and takes every row's draft holding its text, so a prompt's
    feeding shares that saving with the other rows still to be fed (a prompt not yet begun among them) and not with
    those already fed: two prompts joining together are each weighed as one of 2 unless the first was fed."""
    gen = load(batch_bundles["qwen2"], max_batch=2)
    gen.generate(PROMPTS[0], max_new_tokens=4, ignore_eos=True, policy="adaptive")   # creates the shared policy
    policy = gen.shared_policy("adaptive")
    asked = {}
    policy.speculates_at = lambda batch: True
    policy.catch_up_pays = lambda behind, remaining, batch=None, unfed=1: asked.setdefault(behind, unfed) and pays
    gen.clear_prompt_cache()
    first, second = PROMPTS[2], PROMPTS[1]                             # told apart by their lengths
    with gen.scheduler.wake:
        streams = [gen.stream(p, max_new_tokens=8, ignore_eos=True, policy="adaptive") for p in (first, second)]
    for stream in streams:
        stream.wait()
    lengths = [len(s._seq.prompt_ids) for s in streams]
    assert lengths[0] != lengths[1]
    assert asked[lengths[0]] == 2                                      # the second prompt not begun: one of 2
    assert asked[lengths[1]] == (1 if pays else 2)                     # the first fed (paid for), or left unfed


def test_adaptive_weighs_k_for_every_admitted_sequence_while_some_still_prefill(batch_bundles):
    """A batch ramps up: rows decode while others still prefill, chunk by chunk. The shared policy weighs k for
    the whole admitted load, not the few rows already decoding (which turned speculation on, and a catch-up for
    each row, at every ramp-up of a batch too large for it to pay), and is told how many rows the step runs (a plain
    step of fewer rows measures nothing about the load's own plain step: see AdaptivePolicy's recheck)."""
    gen = load(batch_bundles["qwen2"], max_batch=3)
    gen.generate(PROMPTS[0], max_new_tokens=4, ignore_eos=True, policy="adaptive")   # creates the shared policy
    policy = gen.shared_policy("adaptive")
    asked = []
    weigh = policy.next_k
    policy.next_k = lambda max_k, batch=1, drafting=None, rows=None, rows_fed=False: (
        asked.append((batch, rows)) or weigh(max_k, batch, drafting, rows, rows_fed))
    events_before = len(gen.events)
    long_prompts = ["x" * 150 + " = 1\n", "y" * 150 + " = 2\n", "z" * 150 + " = 3\n"]
    together(gen, [(p, dict(max_new_tokens=12, ignore_eos=True, policy="adaptive")) for p in long_prompts])
    ramp = [e for e in gen.events[events_before:] if e.batch < 3]
    assert ramp and ramp[0] is gen.events[events_before]             # the first steps ran before all had prefilled
    assert asked[0] == (3, ramp[0].batch) and ramp[0].batch < 3       # ... weighed for all three, told its rows


def _spinning_entries(session) -> tuple[str | None, str | None]:
    """(allow_spinning, force_spinning_stop) as set on the session; None where unset (onnxruntime's default)."""
    options = session.get_session_options()

    def entry(key):
        try:
            return options.get_session_config_entry(key)
        except RuntimeError:                # onnxruntime raises for a key never set
            return None
    return entry("session.intra_op.allow_spinning"), entry("session.force_spinning_stop")


def test_spinning_modes_reach_the_sessions(batch_bundles):
    """A pair spins within a call and stops when it returns (two sessions take turns on few cores); True and
    False are always and never; anything else is a one-line error."""
    from specedge.runtime.backends.cpu import spinning_mode

    pair = load(batch_bundles["qwen2"])
    for model in (pair.target, pair.draft):
        assert _spinning_entries(model.session) == (None, "1")
    always = load(batch_bundles["qwen2"], spinning=True)
    assert _spinning_entries(always.target.session) == (None, None)
    never = load(batch_bundles["qwen2"], spinning=False)
    assert _spinning_entries(never.draft.session) == ("0", None)
    assert spinning_mode(None, pair=False) == "always" and spinning_mode(None, pair=True) == "in-call"
    with pytest.raises(OptionError, match="spinning must be"):
        load(batch_bundles["qwen2"], spinning="sometimes")
