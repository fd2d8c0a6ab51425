"""End to end on a 12-token vocabulary: speculative sampling is distributed exactly like target sampling.

The exact distribution of the 2nd and 3rd generated tokens (the ones the draft proposes) is computed
by enumeration from the target's warped distributions; speculative samples must fit it, and the same
test must reject a deliberately wrong acceptance rule.
"""


import numpy as np
import pytest
from scipy import stats

import specedge.runtime.verify as verify_module
from conftest import _export
import tiny_models as tm
from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.sampling import Warp, draw

PROMPT = [0, 3, 5]
WARP = dict(temperature=0.7, top_k=6, top_p=0.9)
N_SAMPLES = 3000


@pytest.fixture(scope="module")
def gen(word_bundle):
    return load(word_bundle)


def _warped(gen, context):
    return Warp(**WARP).probs(SlotCursor(gen.target).feed(context)[-1:])[0]


def _exact_joint(gen) -> dict:
    """P(t2, t3) = sum over t1 of P(t1) P(t2 | t1) P(t3 | t1, t2)."""
    joint = {}
    p1 = _warped(gen, PROMPT)
    for t1 in np.flatnonzero(p1):
        p2 = _warped(gen, PROMPT + [t1])
        for t2 in np.flatnonzero(p2):
            p3 = _warped(gen, PROMPT + [t1, t2])
            for t3 in np.flatnonzero(p3):
                joint[(t2, t3)] = joint.get((t2, t3), 0.0) + p1[t1] * p2[t2] * p3[t3]
    return joint


def _samples(gen, **options):
    out = []
    for seed in range(N_SAMPLES):
        r = gen.generate_ids(PROMPT, max_new_tokens=4, seed=seed, ignore_eos=True, **WARP, **options)
        out.append(tuple(r.tokens[1:3]))
    return out


def _pvalue(samples, joint) -> float:
    cells = sorted(joint, key=joint.get, reverse=True)
    big = [c for c in cells if joint[c] * len(samples) >= 5]
    counts = {c: 0 for c in big}
    rest = 0
    for s in samples:
        if s in counts:
            counts[s] += 1
        else:
            rest += 1
    observed = [counts[c] for c in big]
    expected = [joint[c] * len(samples) for c in big]
    rest_expected = len(samples) - sum(expected)
    if rest_expected > 1e-6:
        observed.append(rest)
        expected.append(rest_expected)
    else:                       # every possible pair is a cell of its own: nothing can fall outside them
        assert rest == 0
    return stats.chisquare(observed, expected).pvalue


@pytest.fixture(scope="module")
def joint(gen):
    joint = _exact_joint(gen)
    assert sum(joint.values()) == pytest.approx(1.0)
    assert len(joint) >= 6          # a distribution worth testing, not nearly deterministic
    return joint


def test_target_only_sampling_matches_exact(gen, joint):
    assert _pvalue(_samples(gen, k=0, use_draft=False), joint) > 1e-3


def test_speculative_sampling_matches_exact(gen, joint):
    samples = _samples(gen, k=3)
    assert _pvalue(samples, joint) > 1e-3
    # and the draft really was consulted, with rejections: the residual path is exercised
    r = gen.generate_ids(PROMPT, max_new_tokens=30, seed=1, k=3, ignore_eos=True, **WARP)
    assert 0.2 < r.stats.n_accepted / r.stats.n_drafted < 0.95


def test_wrong_acceptance_rule_is_detected(gen, joint, monkeypatch):
    def resample_from_target(drafts, q, p, rng):
        for i, d in enumerate(drafts):
            if rng.random() * q[i, d] >= p[i, d]:
                return i, draw(p[i], rng)
        return len(drafts), draw(p[len(drafts)], rng)

    monkeypatch.setattr(verify_module, "accept_sampled", resample_from_target)   # where judge() looks it up
    assert _pvalue(_samples(gen, k=3), joint) < 1e-6


def test_seed_makes_runs_reproducible(gen):
    a = gen.generate_ids(PROMPT, max_new_tokens=12, seed=42, k=2, **WARP)
    b = gen.generate_ids(PROMPT, max_new_tokens=12, seed=42, k=2, **WARP)
    assert a.tokens == b.tokens
    runs = {tuple(gen.generate_ids(PROMPT, max_new_tokens=12, seed=s, k=2, **WARP).tokens) for s in range(5)}
    assert len(runs) > 1


@pytest.mark.parametrize("policy,drafter", [("fixed:3", "ngram"), ("fixed:3", "hybrid"), ("heuristic", "model")])
def test_other_drafters_sample_losslessly(gen, joint, policy, drafter):
    assert _pvalue(_samples(gen, policy=policy, drafter=drafter), joint) > 1e-3


@pytest.fixture(scope="module")
def batch_gen(workdir):
    """The same 12-token pair as word_bundle, exported with the batched (standard) attention."""
    n = 12
    target = tm.make_model("qwen2", n, seed=5, init_scale=0.5)
    bundle = _export(workdir, "words-standard", target, tm.perturbed(target, seed=6, noise=0.04),
                     tm.word_tokenizer(n), max_seq_len=32, max_draft=4, attention="standard")
    return load(bundle, max_batch=3)


def test_speculative_sampling_in_a_batch_of_three_matches_exact(batch_gen, joint):
    """Rows of one batch (each with its own seed and RNG) sample exactly like the target, together."""
    samples = []
    for first in range(0, N_SAMPLES // 2, 3):
        with batch_gen.scheduler.wake:                     # the worker admits all three together
            streams = [batch_gen.stream_ids(PROMPT, max_new_tokens=4, seed=first + j, ignore_eos=True, k=3, **WARP)
                       for j in range(3)]
        samples += [tuple(s.wait().tokens[1:3]) for s in streams]
    assert max(e.batch for e in batch_gen.events) == 3
    assert _pvalue(samples, joint) > 1e-3
