"""Speculative greedy output equals target-only greedy output, token for token."""

import pytest

from specedge.runtime import load

PROMPTS = ["def fib(n):", "héllo wörld, ünïcode ✓", "x"]


@pytest.fixture(scope="module")
def gens(arch_bundles, good_bundle):
    return {"good": load(good_bundle), **{f"bad-{a}": load(b) for a, b in arch_bundles.items()}}


def _run(gen, prompt, k, n=120):
    return gen.generate(prompt, max_new_tokens=n, k=k, use_draft=k > 0, ignore_eos=True)


@pytest.mark.parametrize("pair", ["good", "bad-qwen2", "bad-llama", "bad-mistral", "bad-gpt2", "bad-phi3",
                                  "bad-granite", "bad-olmo2", "bad-olmo3",
                                  "bad-smollm3", "bad-gemma", "bad-starcoder2",
                                  "bad-exaone4", "bad-hunyuan"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_speculative_greedy_equals_target_greedy(gens, pair, k):
    gen = gens[pair]
    for prompt in PROMPTS[:2] if pair == "good" else PROMPTS[:1]:
        baseline = _run(gen, prompt, 0)
        result = _run(gen, prompt, k)
        assert len(baseline.tokens) == 120
        assert result.tokens == baseline.tokens
        assert result.text == baseline.text
        s = result.stats
        assert s.n_verify > 0 and s.n_drafted == sum(s.k_history)
        assert s.new_tokens == 120
        # both regimes are exercised: long acceptances with the perturbed copy, frequent rejections otherwise
        rate = s.acceptance_per_position[0]
        if pair == "good":
            assert rate > 0.75, rate
            if k >= 4:
                assert max(s.accepted_at) > 0 and s.accepted_at[k - 1] > 0  # whole runs accepted
        else:
            assert rate < 0.3, rate
            assert s.rejections


def test_stats_are_consistent(gens):
    result = _run(gens["good"], PROMPTS[0], 4)
    s = result.stats
    # the first token comes from prefill; every later step commits its accepted drafts + 1 target token
    plain_steps = s.k_history.count(0)
    assert 1 + s.n_accepted + s.n_verify + plain_steps == len(result.tokens)
    assert s.mean_accepted_length == pytest.approx(1 + s.n_accepted / s.n_verify)
    assert all(0.0 <= a <= 1.0 for a in s.acceptance_per_position)
    assert s.accepted_at == sorted(s.accepted_at, reverse=True)   # position i+1 accepted only after i
    j = s.to_json()
    assert j["time_s"]["draft"] > 0 and j["time_s"]["verify"] > 0 and j["tokens_per_s"] > 0


def test_long_prompt_is_prefilled_in_chunks(gens):
    gen = gens["good"]
    prompt = "def add(a, b):\n    return a + b\n" * 5                    # 160 byte tokens: 3 prefill chunks
    assert len(gen.encode(prompt)) > 2 * 64
    base = gen.generate(prompt, max_new_tokens=60, k=0, use_draft=False, ignore_eos=True)
    spec = gen.generate(prompt, max_new_tokens=60, k=4, ignore_eos=True)
    assert spec.tokens == base.tokens and len(base.tokens) == 60


@pytest.mark.parametrize("k", [0, 3, 8])
def test_stops_at_the_end_of_the_buffer(gens, k):
    gen = gens["good"]
    prompt = "x" * 200                                               # max_seq_len is 256
    result = gen.generate(prompt, max_new_tokens=100, k=k, use_draft=k > 0, ignore_eos=True)
    assert result.stats.stop_reason == "max_seq_len"
    assert len(result.tokens) == 256 - 200 + 1                       # the last token never needs a slot
    if k:
        base = gen.generate(prompt, max_new_tokens=100, k=0, use_draft=False, ignore_eos=True)
        assert result.tokens == base.tokens


def test_eos_and_stop_strings(gens):
    gen = gens["good"]
    base = gen.generate("abc", max_new_tokens=60, k=0, use_draft=False, ignore_eos=True)
    text = base.text
    stop = text[10:13]
    cut = gen.generate("abc", max_new_tokens=60, k=4, stop=[stop], ignore_eos=True)
    assert cut.stats.stop_reason == "stop_string" and cut.text == text[: text.index(stop)]
    streamed = "".join(gen.stream("abc", max_new_tokens=60, k=4, stop=[stop], ignore_eos=True))
    assert streamed == cut.text
    # make the 5th generated token an eos id: generation ends right after it, with or without a draft
    assert base.tokens[4] not in gen.eos_ids
    eos_ids = gen.eos_ids
    gen.eos_ids = eos_ids | {base.tokens[4]}
    try:
        for k in (0, 4):
            r = gen.generate("abc", max_new_tokens=60, k=k, use_draft=k > 0)
            first = base.tokens.index(base.tokens[4])
            assert r.tokens == base.tokens[: first + 1] and r.stats.stop_reason == "eos"
    finally:
        gen.eos_ids = eos_ids


@pytest.mark.parametrize("pair", ["good", "bad-llama"])
@pytest.mark.parametrize("policy,drafter", [("heuristic", "model"), ("adaptive", "model"), ("adaptive:stop", "model"),
                                            ("adaptive", "ngram"), ("fixed:4", "ngram"), ("adaptive", "hybrid"),
                                            ("fixed:3", "hybrid")])
def test_every_policy_keeps_greedy_exact(gens, pair, policy, drafter):
    gen = gens[pair]
    prompt = "for i in range(10):\n    print(i)\n" * 2                # repeats itself: n-gram matches exist
    baseline = gen.generate(prompt, max_new_tokens=100, k=0, use_draft=False, ignore_eos=True)
    result = gen.generate(prompt, max_new_tokens=100, policy=policy, drafter=drafter, ignore_eos=True)
    assert result.tokens == baseline.tokens
    assert result.stats.n_drafted > 0


def test_ngram_runs_without_a_draft_model(tmp_path, workdir):
    import tiny_models as tm
    from specedge.export import export_bundle

    folder = tm.save(tm.make_model("qwen2", 260, seed=1), tm.byte_tokenizer(), tmp_path / "t")
    solo = load(export_bundle(str(folder), None, tmp_path / "solo", max_seq_len=256, progress=None))
    prompt = "abcabcabcabc"
    baseline = solo.generate(prompt, max_new_tokens=50, k=0, ignore_eos=True)
    result = solo.generate(prompt, max_new_tokens=50, drafter="ngram", ignore_eos=True)
    assert result.tokens == baseline.tokens and result.stats.n_drafted > 0
    assert result.stats.n_draft_calls == 0                 # lookups are not draft-model calls
