"""Speculative greedy output equals target-only greedy output, token for token."""

import pytest

from specedge.runtime import load

PROMPTS = ["def fib(n):", "héllo wörld, ünïcode ✓", "x"]


@pytest.fixture(scope="module")
def gens(arch_bundles, good_bundle):
    return {"good": load(good_bundle), **{f"bad-{a}": load(b) for a, b in arch_bundles.items()}}


def _run(gen, prompt, k, n=120):
    return gen.generate(prompt, max_new_tokens=n, k=k, use_draft=k > 0, ignore_eos=True)


@pytest.mark.parametrize("pair", ["good", "bad-qwen2", "bad-llama", "bad-mistral", "bad-gpt2"])
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
