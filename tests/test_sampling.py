"""Warping matches transformers' logits processors; acceptance rules on synthetic distributions."""

import numpy as np
import pytest
import torch
from scipy import stats
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specedge.errors import SpecedgeError
from specedge.runtime.sampling import Warp, draw
from specedge.runtime.verify import accept_greedy_ids, accept_sampled


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.6, 8, 0.9)])
def test_warp_matches_transformers(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(4, 50)).astype(np.float32) * 3
    x = torch.tensor(logits)
    x = TemperatureLogitsWarper(temperature)(None, x)
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p < 1:
        x = TopPLogitsWarper(top_p)(None, x)
    expected = torch.softmax(x, dim=-1).numpy()
    got = Warp(temperature, top_k, top_p).probs(logits)
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_are_an_error_not_a_sample(bad):
    """NaN logits (a float16 graph overflowing, damaged weights) once sampled padding tokens with exit 0; the load
    probe catches weights that always compute NaN, this a step that does (the scheduler fails its sequences)."""
    logits = np.zeros((2, 8), np.float32)
    logits[1, 3] = bad
    for warp in (Warp(1.0), Warp(0.7, top_k=4), Warp(1.0, top_p=0.9)):
        with pytest.raises(SpecedgeError, match="logits are not finite"):
            warp.probs(logits)
        assert np.allclose(warp.probs(logits[:1]).sum(-1), 1.0)


def test_draw_follows_distribution():
    p = np.array([0.5, 0.0, 0.2, 0.3])
    rng = np.random.default_rng(1)
    counts = np.bincount([draw(p, rng) for _ in range(4000)], minlength=4)
    assert counts[1] == 0
    assert stats.chisquare(counts[[0, 2, 3]], 4000 * p[[0, 2, 3]]).pvalue > 1e-3


def test_accept_greedy():
    ids = np.array([1, 2, 3, 4])                       # target wants 1, 2, 3, then 4
    assert accept_greedy_ids([1, 2, 3], ids) == (3, 4)
    assert accept_greedy_ids([1, 0, 3], ids) == (1, 2)
    assert accept_greedy_ids([0, 2, 3], ids) == (0, 1)
    assert accept_greedy_ids([], ids[:1]) == (0, 1)


def _first_token_counts(rule, n=20000, seed=0):
    rng = np.random.default_rng(seed)
    p = np.array([[0.45, 0.05, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0], [0.2] * 5])
    q = np.array([[0.1, 0.5, 0.1, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25, 0.0]])
    counts = np.zeros(5, int)
    for _ in range(n):
        drafts = [draw(q[0], rng), draw(q[1], rng)]
        accepted, token = rule(drafts, q, p, rng)
        counts[(drafts[:accepted] + [token])[0]] += 1
    return counts, p[0]


def _wrong_rule(drafts, q, p, rng):
    """A classic mistake: at a rejection, resample from p instead of norm(max(p - q, 0))."""
    for i, d in enumerate(drafts):
        if rng.random() * q[i, d] >= p[i, d]:
            return i, draw(p[i], rng)
    return len(drafts), draw(p[len(drafts)], rng)


def test_accept_sampled_is_lossless_and_test_has_power():
    counts, p0 = _first_token_counts(accept_sampled)
    support = p0 > 0
    assert counts[~support].sum() == 0
    assert stats.chisquare(counts[support], counts.sum() * p0[support]).pvalue > 1e-3
    wrong, _ = _first_token_counts(_wrong_rule)
    assert stats.chisquare(wrong[support], wrong.sum() * p0[support]).pvalue < 1e-6
