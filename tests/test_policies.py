"""Speculation policies: switch-off and recovery proven by counting, with deterministic costs."""

import pytest

from specedge.errors import OptionError
from specedge.runtime.drafters import NgramDrafter
from specedge.runtime.policies import AdaptivePolicy, FixedPolicy, HeuristicPolicy, make_policy

DRAFT_S, VERIFY_BASE_S, VERIFY_PER_TOKEN_S = 0.03, 0.25, 0.02     # a CPU-like regime: verify nearly flat


def _feed(policy, accept_prob_fn, steps, max_k=8):
    """Drives a policy with a synthetic draft: position i accepted iff accept_prob_fn(step, i)."""
    ks = []
    for step in range(steps):
        k = policy.next_k(max_k)
        n = 0
        while n < k and accept_prob_fn(step, n):
            n += 1
        policy.observe(k, n, DRAFT_S * k, VERIFY_BASE_S + VERIFY_PER_TOKEN_S * (k + 1), k + 1)
        ks.append(k)
    return ks


def test_adaptive_switches_off_with_a_useless_draft_and_back_on():
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    useless = _feed(policy, lambda step, i: False, 60)
    first_off = useless.index(0)
    assert first_off <= 12, useless                                   # converges within a bounded number of steps
    tail = useless[first_off:]
    assert tail.count(0) >= len(tail) - len(tail) // 16 - 1          # off except for probes with k = 1
    assert set(tail) <= {0, 1}
    recovered = _feed(policy, lambda step, i: True, 60)             # the draft becomes perfect
    first_on = next(i for i, k in enumerate(recovered) if k >= 4)
    assert first_on <= 40, recovered
    assert all(k >= 4 for k in recovered[first_on + 5:])


def test_adaptive_prefers_long_drafts_when_they_are_cheap_and_accepted():
    policy = AdaptivePolicy(max_draft=8)
    ks = _feed(policy, lambda step, i: i < 6, 80)                   # six accepted, the seventh rejected
    assert 5 <= sorted(ks[-20:])[10] <= 8


def test_adaptive_goes_off_when_verification_is_expensive():
    policy = AdaptivePolicy(max_draft=8)
    for step in range(80):                                          # acceptance 0.5, verify cost grows steeply
        k = policy.next_k(8)
        n = 1 if k and step % 2 else 0
        policy.observe(k, min(n, k), DRAFT_S * k, 0.1 * (k + 1), k + 1)
    assert policy.next_k(8) == 0


def test_heuristic_rule():
    policy = HeuristicPolicy(start=5, limit=8)
    assert policy.next_k(8) == 5
    policy.observe(5, 5, 0, 0, 6)
    assert policy.next_k(8) == 7
    policy.observe(7, 2, 0, 0, 8)
    assert policy.next_k(8) == 6
    for _ in range(10):
        policy.observe(1, 0, 0, 0, 2)
    assert policy.next_k(8) == 1                                    # never below 1


def test_make_policy_names():
    assert isinstance(make_policy("fixed:3", 8)[0], FixedPolicy)
    assert make_policy("target", 8)[1] == "none"
    assert make_policy("ngram", 8)[1] == "ngram" and make_policy("hybrid:4", 8)[1] == "hybrid"
    for bad in ("fixed:9", "fixed:x", "bogus", "adaptive:3"):
        with pytest.raises(OptionError):
            make_policy(bad, 8)


def test_ngram_lookup():
    drafter = NgramDrafter(vocab_size=100)
    assert drafter.lookup([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]      # longest suffix 1 2 3
    assert drafter.lookup([1, 2, 9, 7, 2, 8, 2], 2) == [8, 2]            # most recent match of "2"
    assert drafter.lookup([1, 2, 3], 4) == []


def test_adaptive_early_stop_learns_which_confidences_get_rejected():
    """Drafts with confidence < 0.5 are always rejected, the others always accepted: after training,
    drafting stops at a low-confidence draft and goes on after high-confidence ones (counted, not timed)."""
    policy = AdaptivePolicy(max_draft=8, early_stop=True)
    stops_low, stops_high = [], []
    for step in range(200):
        k = policy.next_k(8)
        confidences = []
        for i in range(k):
            confidences.append(0.3 if (step + i) % 5 == 0 else 0.95)
            if i == k - 1 or not policy.keep_drafting(confidences):
                break
            (stops_low if confidences[-1] < 0.5 else stops_high).append(False)
        else:
            confidences = []
        if confidences and len(confidences) < k:
            (stops_low if confidences[-1] < 0.5 else stops_high).append(True)
        n = next((i for i, c in enumerate(confidences) if c < 0.5), len(confidences))
        policy.observe(len(confidences), n, DRAFT_S * len(confidences),
                       VERIFY_BASE_S + VERIFY_PER_TOKEN_S * (len(confidences) + 1), len(confidences) + 1)
        policy.observe_confidences(confidences, n)
    assert policy.calibration.acceptance(0.3) < 0.1 and policy.calibration.acceptance(0.95) > 0.9
    assert sum(stops_low[-20:]) == 20                      # always stops right after a draft it knows is wrong
    assert not any(stops_high[-50:])                       # never after a confident one (acceptance ~1)


def test_early_stop_can_be_turned_off():
    policy = AdaptivePolicy(max_draft=8, early_stop=False)
    _feed(policy, lambda step, i: i < 2, 20)
    assert policy.keep_drafting([0.01, 0.01])


def test_adaptive_stop_spec():
    policy, kind = make_policy("adaptive:stop", 8)
    assert kind == "model" and policy.early_stop is True
    assert make_policy("adaptive", 8)[0].early_stop is False      # off by default: measured not to pay
