"""Speculation policies: switch-off and recovery proven by counting, with deterministic costs."""

import pytest

from specedge.errors import OptionError
from specedge.runtime.drafters import lookup, lookup_for
from specedge.runtime.load_stretches import LoadStretches
from specedge.runtime.policies import RECHECK_MARGIN, AdaptivePolicy, FixedPolicy, HeuristicPolicy, make_policy
from specedge.runtime.step_costs import FeedCost

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
    useless = _feed(policy, lambda step, i: False, 200)
    first_off = useless.index(0)
    assert first_off <= 12, useless                                   # converges within a bounded number of steps
    tail = useless[first_off:]
    assert set(tail) <= {0, 1}                                        # off except for probes with k = 1
    probes = [i for i, k in enumerate(tail) if k == 1]
    assert len(probes) <= len(tail) // 16 and 64 <= probes[-1] - probes[-2] <= 66, probes   # failed probes back off
    recovered = _feed(policy, lambda step, i: True, 150)            # the draft becomes perfect
    first_on = next(i for i, k in enumerate(recovered) if k >= 4)
    assert first_on <= 100, recovered
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
    assert isinstance(make_policy("fixed:3", 8), FixedPolicy)
    assert make_policy("target", 8).k == 0
    assert make_policy("adaptive", 8).shared and not make_policy("heuristic", 8).shared
    for bad in ("fixed:9", "fixed:x", "bogus", "adaptive:3", "ngram", "hybrid:4"):
        with pytest.raises(OptionError):
            make_policy(bad, 8)
    with pytest.raises(OptionError, match="--drafter ngram"):          # drafters are their own axis now
        make_policy("ngram", 8)


def test_ngram_lookup():
    assert lookup([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]      # longest suffix 1 2 3
    assert lookup([1, 2, 9, 7, 2, 8, 2], 2) == [8, 2]            # most recent match of "2"
    assert lookup([1, 2, 3], 4) == []
    assert lookup_for("hybrid", [1, 2, 9, 7, 2, 8, 2], 2) == []  # hybrid wants a match of 2 tokens or more
    assert lookup_for("hybrid", [1, 2, 9, 1, 2], 2) == [9, 1]
    assert lookup_for("model", [1, 2, 1], 2) == []


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
    policy = make_policy("adaptive:stop", 8)
    assert policy.early_stop is True
    assert make_policy("adaptive", 8).early_stop is False      # off by default: measured not to pay


def _batch_costs(batch: int, k: int) -> tuple[float, float]:
    """A compute-bound regime as a batch grows: -> (seconds per draft step, seconds per verify phase) at batch B;
    verify costs 0.25 s for the first 4 tokens of the call and 0.06 s per token beyond."""
    tokens = batch * (k + 1)
    return 0.01 * batch, 0.25 + 0.06 * max(0, tokens - 4)


def _drive_batch(policy, batch: int, steps: int, accept=lambda i: i < 3, max_k=8) -> list[int]:
    ks = []
    for _ in range(steps):
        k = policy.next_k(max_k, batch=batch)
        draft_s, verify_s = _batch_costs(batch, k)
        policy.observe_costs(k, draft_s * k, verify_s, batch * (k + 1), batch)
        for _ in range(batch):
            n = 0
            while n < k and accept(n):
                n += 1
            policy.observe_acceptance(k, n)
        ks.append(k)
    return ks


def test_adaptive_shrinks_k_to_zero_as_the_batch_grows_and_returns_when_it_falls():
    """Counted with deterministic costs where verify cost grows with B x T: speculation pays at B = 1, not at
    B = 8 (every verified token costs), and comes back at B = 1."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    alone = _drive_batch(policy, 1, 60)
    assert sorted(alone[-20:])[10] >= 2, alone
    crowded = _drive_batch(policy, 8, 80)
    tail = crowded[-40:]
    assert tail.count(0) >= len(tail) - len(tail) // 16 - 1 and set(tail) <= {0, 1}, crowded
    again = _drive_batch(policy, 1, 60)
    assert sorted(again[-20:])[10] >= 2, again


def test_adaptive_stays_off_with_acceptance_zero_apart_from_probes():
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    ks = _drive_batch(policy, 1, 200, accept=lambda i: False)
    tail = ks[-160:]
    assert tail.count(1) <= len(tail) // 16 + 1 and set(tail) <= {0, 1}, ks


def test_adaptive_a_near_tie_with_k0_goes_to_k0():
    """A useless draft costing 2% of a step and a verify cost flat in tokens (the tiny-pair case where adaptive
    used to settle at k = 1): k = 1 only ties k = 0 within the margin, so it must not win."""
    policy = AdaptivePolicy(max_draft=2, probe_every=1000)
    ks = []
    for _ in range(100):
        k = policy.next_k(2)
        policy.observe(k, 0, 0.002 * k, 0.1, k + 1)
        ks.append(k)
    assert ks[-50:] == [0] * 50, ks


def test_cost_model_keeps_a_curve_per_batch_size():
    """Eight rows of one token cost more than one row of eight (each row attends over its own buffer): the
    verify cost at a batch size comes from that batch size's own curve; an unseen one from total tokens."""
    from specedge.runtime.step_costs import CostModel

    costs = CostModel()
    costs.observe_verify(8, 1.0, batch=8)          # B = 8, T = 1
    costs.observe_verify(8, 0.3, batch=1)          # B = 1, T = 8
    costs.observe_verify(2, 0.2, batch=1)          # B = 1, T = 2
    assert costs.verify(8, 8) == 1.0 and costs.verify(8, 1) == 0.3
    assert costs.verify(5, 1) == pytest.approx(0.25)                    # on B = 1's own line over T
    assert costs.verify(16, 4) == pytest.approx(costs.by_tokens(16))   # B = 4 unseen: total tokens


def test_adaptive_measures_the_plain_step_at_a_new_batch_size_first():
    """k = 0 is the baseline every k is weighed against: at a batch size whose plain step was never measured it is
    measured (k = 0) rather than extrapolated from the verify sizes tried there."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    _drive_batch(policy, 1, 30)
    assert policy.next_k(8, batch=3) == 0
    draft_s, verify_s = _batch_costs(3, 0)
    policy.observe_costs(0, 0.0, verify_s, 3, 3)
    assert policy.costs.measured(3, 1)


def test_one_measured_size_extrapolates_halfway_between_free_and_proportional():
    from specedge.runtime.step_costs import SINGLE_POINT_GROWTH, CostCurve

    curve = CostCurve()
    curve.observe(2, 0.1)
    assert curve(4) == pytest.approx(0.1 * (1 + SINGLE_POINT_GROWTH)) and 0.1 < curve(4) < 0.2


def test_adaptive_tells_whether_a_batch_size_would_speculate_without_changing_its_state():
    """A sequence joining a batch feeds its prompt to the draft only if the policy would speculate at that batch
    size: known sizes are weighed as next_k weighs them, a size not yet measured speculates only alone, and asking
    changes nothing (no probe counted, no step, no batch size remembered)."""
    fresh = AdaptivePolicy(max_draft=8, probe_every=16)
    assert fresh.speculates_at(1) and not fresh.speculates_at(4)
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    _drive_batch(policy, 1, 60)
    _drive_batch(policy, 8, 80)
    _drive_batch(policy, 1, 30)
    state = (policy.steps, dict(policy.since_probe), policy.probing, policy.last_batch, policy.off,
             dict(policy.probe_gaps))
    assert policy.speculates_at(1) and not policy.speculates_at(8) and not policy.speculates_at(5)
    assert (policy.steps, policy.since_probe, policy.probing, policy.last_batch, policy.off,
            policy.probe_gaps) == state


def test_adaptive_catches_a_draft_up_only_when_the_tokens_left_repay_it():
    """Catching up costs its measured seconds per token; speculating saves 1/plain - 1/best a token over the
    tokens left. Before a catch-up has been measured the rule is the plain one: no more behind than left."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    _drive_batch(policy, 1, 60)
    assert policy.catch_up_pays(100, 100) and not policy.catch_up_pays(100, 99)
    policy.observe_catch_up(32, 0.032)
    policy.observe_catch_up(64, 0.064)                                 # 1 ms a token, no fixed cost
    plain, best, _ = policy._row_rates(1)
    saved = 1 / plain - 1 / best
    assert saved > 0
    needed = 100 * 0.001 / saved                                       # tokens left that repay 100 behind
    assert policy.catch_up_pays(100, int(needed) + 1) and not policy.catch_up_pays(100, int(needed) - 1)


def _drive_rows(policy, batch: int, steps: int, verify_s, draft_s, accept=lambda i: True, max_k=8) -> list[list[int]]:
    """As the scheduler drives a shared policy: a probe drafts for `policy.probing` rows only, the verify call is
    right-padded to the longest row. verify_s(B, T), draft_s(rows) are seconds. -> k per row, step by step."""
    steps_k = []
    for _ in range(steps):
        k = policy.next_k(max_k, batch=batch)
        rows = min(policy.probing, batch) if policy.probing else batch
        ks = [k] * rows + [0] * (batch - rows) if k else [0] * batch
        policy.observe_costs(k, draft_s(rows) * k, verify_s(batch, k + 1), batch * (k + 1), batch, rows if k else None)
        for row_k in ks:
            n = 0
            while n < row_k and accept(n):
                n += 1
            policy.observe_acceptance(row_k, n)
        steps_k.append(ks)
    return steps_k


def _cpu_like_verify(batch: int, t: int) -> float:
    """Verify cost on the AVX2 EPYC with the int4 pair: at B = 1 extra tokens are nearly free, at B >= 2 about
    linear in the call's tokens (B = 4: T = 2 costs 1.7x T = 1, measured 0.178 s against 0.105 s)."""
    return 0.046 + 0.004 * (t - 1) if batch == 1 else 0.025 * batch * (1 + 0.7 * (t - 1))


def test_adaptive_stops_probing_where_even_perfect_acceptance_cannot_pay():
    """Every draft accepted, yet at B = 4 verifying 2 tokens a row costs 1.7x one and the draft costs per row:
    once a probe has measured that, the policy waits its longest gap before the next one, while at B = 1 it
    speculates. Before this it probed every 16 steps at B = 4, each probe a slower step and a draft catch-up."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    draft = lambda rows: 0.018 * rows                                 # noqa: E731
    alone = _drive_rows(policy, 1, 40, _cpu_like_verify, draft)
    assert sum(k[0] for k in alone[-10:]) >= 30                       # B = 1: speculation on, k >= 3
    crowded = _drive_rows(policy, 4, 300, _cpu_like_verify, draft)
    probes = [i for i, ks in enumerate(crowded) if any(ks)]
    assert 1 <= len(probes) <= 3, probes                              # one to measure T = 2, one for the draft
    assert all(sum(1 for k in crowded[i] if k) <= 2 for i in probes)  # a probe drafts for one or two rows, not 4
    assert policy.costs.measured(4, 2) and policy.probe_gap(4) == policy.max_probe_gap
    assert all(not any(ks) for ks in crowded[probes[-1] + 1:])


def test_adaptive_probe_clock_is_per_batch_size():
    """Waves of requests pass through B = 1 (speculation on) between long stretches at B = 4 (off): speculation
    winning at B = 1 must not restart the probe clock at B = 4, which it did, probing there every 16 steps."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    draft = lambda rows: 0.018 * rows                                 # noqa: E731
    verify = lambda b, t: 0.046 + 0.004 * (t - 1) if b == 1 else 0.025 * b * t + 0.02 * (t - 1) * b  # noqa: E731
    probes = 0
    for _ in range(8):                                                # 8 waves
        _drive_rows(policy, 1, 5, verify, draft)
        probes += sum(1 for ks in _drive_rows(policy, 4, 50, verify, draft) if any(ks))
    assert probes <= 3, probes


def test_adaptive_measures_a_batch_size_before_every_row_speculates():
    """Where verifying more tokens is nearly free (a GPU at small B) k > 0 wins at B = 4 on costs extrapolated
    from the plain step alone: a probe (one or two rows) measures T = 2 there first, then every row speculates."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    flat = lambda b, t: 0.01 + 0.0005 * b * t                         # noqa: E731
    draft = lambda rows: 0.001 + 0.0001 * rows                        # noqa: E731
    _drive_rows(policy, 1, 30, flat, draft)
    crowded = _drive_rows(policy, 4, 30, flat, draft)
    first = next(i for i, ks in enumerate(crowded) if any(ks))
    assert crowded[:first] == [[0] * 4] * first and first <= 2      # the plain step at B = 4 is measured first
    assert 1 <= sum(1 for k in crowded[first] if k) <= 2             # then a probe
    assert policy.costs.measured(4, 2)
    assert all(min(ks) >= 2 for ks in crowded[-10:]), crowded         # then every row drafts


def test_probe_drafts_two_rows_until_the_draft_is_timed_at_two_row_counts():
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    draft = lambda rows: 0.018 * rows                                 # noqa: E731
    _drive_rows(policy, 1, 40, _cpu_like_verify, draft)
    assert list(policy.costs.draft.seen) == [1]
    crowded = _drive_rows(policy, 4, 40, _cpu_like_verify, draft)
    probes = [ks for ks in crowded if any(ks)]
    assert sum(1 for k in probes[0] if k) == 2 and sorted(policy.costs.draft.seen) == [1, 2]
    assert all(sum(1 for k in ks if k) == 1 for ks in probes[1:])


def _one_drafting_row_loses(b: int, t: int) -> float:
    """Verify seconds where each extra token a row costs 0.6 of a plain step at B = 2 (0.1 at B = 1): with every
    draft accepted, both rows drafting beat the plain step at B = 2 and one row drafting does not."""
    return 0.05 * (1 + 0.1 * (t - 1)) if b == 1 else 0.05 * b * (1 + 0.6 * (t - 1))


def test_adaptive_weighs_rows_that_cannot_draft_as_committing_one_token():
    """A row whose draft was not fed its text rides along at k = 0 and still pays for the right-padded verify
    call: weighed as if it drafted, speculation turned on at B = 2 for the other row and lost. Off for that
    reason alone, a joining sequence is still fed (as if all drafted), and the policy weighs again once the
    count of rows that can draft changes, without waiting for a probe."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    draft = lambda rows: 0.004 * rows                                 # noqa: E731
    _drive_rows(policy, 1, 30, _one_drafting_row_loses, draft)
    _drive_rows(policy, 2, 40, _one_drafting_row_loses, draft)
    assert policy.next_k(8, batch=2, drafting=2) >= 1
    assert policy.next_k(8, batch=2, drafting=1) == 0 and policy.off
    assert policy.speculates_at(2)
    assert policy.next_k(8, batch=2, drafting=2) >= 1
    assert policy.next_k(8, batch=2, drafting=0) == 0


def test_feeding_a_draft_is_weighed_at_the_batch_size_it_joins():
    """What feeding a draft its missing text (a prompt, or what it missed) saves is read off the per-row rates at
    the batch size the row is in: at B = 2 speculation gains less a token than alone, so it takes more tokens to go
    to repay the same 100. The saving is the whole batch's and takes every row's draft fed, so where both rows lack
    their text each repays half of it; a size never measured falls back to no more behind than left."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    draft = lambda rows: 0.004 * rows                                 # noqa: E731
    _drive_rows(policy, 2, 40, _one_drafting_row_loses, draft)
    _drive_rows(policy, 1, 30, _one_drafting_row_loses, draft)
    policy.observe_catch_up(32, 0.32)
    policy.observe_catch_up(64, 0.64)                                 # 10 ms a token
    needed = {}
    for b in (1, 2):
        plain, best, _ = policy._row_rates(b)
        needed[b] = 100 * 0.01 / (1 / plain - 1 / best)
        assert policy.catch_up_pays(100, int(needed[b]) + 1, batch=b)
        assert not policy.catch_up_pays(100, int(needed[b]) - 1, batch=b)
    assert needed[2] > 1.2 * needed[1], needed
    assert not policy.catch_up_pays(100, int(needed[2]) + 1, batch=2, unfed=2)       # the other row lacks its text too
    assert not policy.catch_up_pays(100, int(2 * needed[2]) - 2, batch=2, unfed=2)
    assert policy.catch_up_pays(100, int(2 * needed[2]) + 2, batch=2, unfed=2)
    assert policy.catch_up_pays(100, 100, batch=8) and not policy.catch_up_pays(100, 99, batch=8)


def test_feeding_is_weighed_on_what_was_observed_since_the_last_weighing():
    """Off, the policy does not weigh k again until its probe, but whether feeding a draft pays is read off what was
    observed since: weighed on the rates of a weighing made after bench's warm-up, every second row of a wave of 2
    stayed unfed (a predicted +1.4% where the costs measured since said about +8%), and so did speculation."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    _drive_batch(policy, 1, 60)
    policy.observe_catch_up(32, 0.32)
    policy.observe_catch_up(64, 0.64)                                 # 10 ms a token
    weighed = policy._row_rates(1)[:2]                               # as weighed before the draft got worse
    for _ in range(20):
        policy.observe_acceptance(4, 0)                               # the draft got worse; nothing weighed since
    plain, best, _ = policy._row_rates(1)
    assert plain == pytest.approx(weighed[0]) and 1.5 < best / plain < weighed[1] / weighed[0] - 0.5
    needed = {name: 1000 * 0.01 / (1 / p - 1 / b) for name, (p, b) in (("weighed", weighed), ("now", (plain, best)))}
    assert needed["now"] > 1.2 * needed["weighed"], needed            # tokens to go that repay 1000 behind
    assert not policy.catch_up_pays(1000, int(needed["now"]) - 1)
    assert policy.catch_up_pays(1000, int(needed["now"]) + 1)


def test_feeding_costs_a_call_plus_a_cost_a_token():
    """Catch-ups of a token or two cost about a whole draft call each; a prompt of 40 fed in one call costs that
    call plus a little a token: weighed per token averaged over the small ones, the prompt looked 3x dearer and
    was kept from the draft where speculating repaid it."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    _drive_batch(policy, 1, 60)
    for tokens in (1, 2, 1, 3, 2):
        policy.observe_catch_up(tokens, 0.010 + 0.003 * tokens)
    policy.observe_catch_up(40, 0.010 + 0.003 * 40)
    assert policy.catch_up(40) == pytest.approx(0.13, rel=0.02)
    assert policy.catch_up(20) == pytest.approx(0.07, rel=0.02)      # read off the line between
    assert policy.catch_up(400) == pytest.approx(1.3, rel=0.02)      # past 40: 40 tokens a call, 10 calls
    plain, best, _ = policy._row_rates(1)
    saved = 1 / plain - 1 / best
    needed = 0.13 / saved                                             # tokens to go that repay a 40-token prompt
    assert policy.catch_up_pays(40, int(needed * 1.05) + 1) and not policy.catch_up_pays(40, int(needed * 0.95))


def test_feed_cost_keeps_a_sane_shape_on_few_or_noisy_calls():
    """The fit's guards: one size measured prices in proportion; a flat line past the sizes measured does not make
    a long prompt as cheap as one small call; a negative intercept does not make small feeds free; old calls age
    out."""
    one = FeedCost()
    one.observe(2, 0.03)
    assert one(60) == pytest.approx(0.9)                              # in proportion: the old per-token price
    flat = FeedCost()
    for tokens, seconds in ((2, 0.036), (3, 0.033), (4, 0.035)):
        flat.observe(tokens, seconds)
    assert flat(4) == pytest.approx(0.035, rel=0.1) and flat(400) == pytest.approx(100 * flat(4))
    steep = FeedCost()
    for tokens, seconds in ((64, 0.2), (128, 0.5), (256, 1.2)):
        steep.observe(tokens, seconds)
    assert 0.02 < steep(8) < 0.2                                      # no fixed cost below 0: not free
    recent = FeedCost(keep=4)
    for _ in range(4):
        recent.observe(10, 1.0)
    for _ in range(4):
        recent.observe(10, 0.1)
    assert recent(10) == pytest.approx(0.1)
    assert FeedCost()(10) is None and recent(0) == 0.0


def test_one_slow_feeding_call_does_not_price_every_prompt():
    """A bench warm-up fed the draft 5 tokens in 0.034 s and, once, in 0.309 s: averaged, every prompt cost 34 ms a
    token, prompts were judged not worth feeding, nothing was measured again, and lone requests ran without their
    draft. Each size enters as the lower median of its calls."""
    warm = FeedCost()
    warm.observe(5, 0.034)
    warm.observe(5, 0.309)
    assert warm(21) == pytest.approx(21 * 0.034 / 5)
    mixed = FeedCost()
    for seconds in (0.030, 0.032, 0.031, 0.300, 0.029):               # one slow call among five of 5 tokens
        mixed.observe(5, seconds)
    for seconds in (0.20, 0.21):
        mixed.observe(64, seconds)
    assert mixed(5) == pytest.approx(0.030, rel=0.05) and mixed(64) == pytest.approx(0.20, rel=0.05)


def test_an_idle_engine_ends_the_stretch_so_a_lone_request_is_not_capped():
    """A drain ends with one row for a few steps, then nothing; the next lone request grows from nothing, so what
    feeding its prompt can earn is not capped by how long drains stayed at one row."""
    drains = [2, 2, 1, 1, 1, 2, 1]                                    # one row for 3 steps, then the last drain
    unseen = LoadStretches()
    for b in drains + [1]:                                            # the idle engine unseen: the lone request
        unseen.tick(b)                                                # continues the drain's stretch, capped
    assert unseen.steps_left(1) == 3
    clock = LoadStretches()
    for b in drains:
        clock.tick(b)
    clock.idle()
    assert clock.mean_steps == {1: 0.7 * 3 + 0.3 * 1}                 # the last drain's stretch is learned too
    clock.tick(1)
    assert clock.steps_left(1) is None


def test_load_stretches_learn_how_long_the_load_stays_where_it_dropped():
    clock = LoadStretches()
    for b in [1, 2, 2, 2]:                                            # growing: nothing learned, nothing capped
        clock.tick(b)
    assert clock.steps_left(2) is None and clock.steps_left(1) is None
    for b in [1, 1, 1, 2, 2]:                                         # dropped to 1 for 3 steps
        clock.tick(b)
    assert clock.mean_steps == {1: 3} and clock.steps_left(2) is None
    assert clock.steps_left(1) == 3                                   # asked before the next drop's first step
    for b in [1] * 5:                                                 # this stretch outlives the usual length
        clock.tick(b)
    assert clock.steps_left(1) == 5
    clock.tick(2)
    assert clock.mean_steps[1] == pytest.approx(0.7 * 3 + 0.3 * 5)


def test_a_row_alone_between_requests_does_not_catch_up_for_the_few_steps_before_the_next_joins():
    """At two clients a request ends and the next arrives 3 steps later: a lone row's draft, behind because
    speculation was off at B = 2, caught up 20 tokens for a step or two at B = 1. Weighed against how long B = 1
    lasted after earlier drops it does not pay, while the same catch-up for a lone request (B = 1 reached by
    growing, no cap) and for a drop that outlives the usual stretch does."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    draft = lambda rows: 0.02 * rows                                  # noqa: E731
    two = lambda i: i < 2                                             # noqa: E731 - two drafts accepted a step
    _drive_rows(policy, 1, 30, _one_drafting_row_loses, draft, two)
    _drive_rows(policy, 2, 40, _one_drafting_row_loses, draft, two)
    policy.observe_catch_up(20, 0.4)                                  # 20 ms a token
    plain, best, tokens = policy._row_rates(1)
    needed = 20 * 0.02 / (1 / plain - 1 / best)                      # tokens to go that repay 20 behind
    assert needed < 60 and tokens * 3 < needed
    fresh = AdaptivePolicy(max_draft=8, probe_every=16)
    _drive_rows(fresh, 1, 30, _one_drafting_row_loses, draft, two)
    fresh.observe_catch_up(20, 0.4)
    assert fresh.catch_up_pays(20, 60, batch=1)                       # lone requests: uncapped
    for _ in range(4):                                                # requests end, B = 1 for 3 steps, B = 2 again
        _drive_rows(policy, 1, 3, _one_drafting_row_loses, draft, two)
        _drive_rows(policy, 2, 20, _one_drafting_row_loses, draft, two)
    assert policy.stretches.mean_steps[1] == pytest.approx(3)
    assert not policy.catch_up_pays(20, 60, batch=1)                 # about to drop to 1: 3 steps are not enough
    _drive_rows(policy, 1, int(needed / tokens) + 2, _one_drafting_row_loses, draft, two)
    assert policy.catch_up_pays(20, 60)                               # the other client went quiet: now it pays


def test_a_narrow_win_is_checked_against_a_fresh_plain_step():
    """The plain step is not measured while speculation is on. Measured in a slow burst (0.25 s where it costs
    0.20), it made k = 1 win at B = 8 (16 tokens in 0.43 s against 8 in 0.25) and, never measured again, kept it
    on after the burst. A narrow win re-measures the plain step once its measurement is `recheck_after` steps old,
    and the estimates forget by steps gone by, so one fresh measurement turns speculation off."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    burst = [True]
    verify = lambda b, t: (0.25 if burst[0] else 0.20) if t == 1 else 0.2 * (1 + 0.55 * (t - 1))  # noqa: E731
    draft = lambda rows: 0.015 * rows                                 # noqa: E731
    _drive_rows(policy, 1, 30, lambda b, t: 0.05 + 0.002 * t, draft)
    during = _drive_rows(policy, 8, 40, verify, draft)
    assert sum(1 for ks in during[-10:] if min(ks) >= 1) >= 9        # k > 0 won against the burst's plain step
    burst[0] = False
    after = _drive_rows(policy, 8, 80, verify, draft)
    first_plain = next(i for i, ks in enumerate(after) if not any(ks))
    assert first_plain <= policy.recheck_after
    assert sum(1 for ks in after[first_plain:] if any(ks)) <= 3, after  # then off, apart from a probe or two
    calm = AdaptivePolicy(max_draft=8, probe_every=16)                # a clear win is never interrupted
    _drive_rows(calm, 1, 30, lambda b, t: 0.05 + 0.002 * t, draft)
    assert all(min(ks) >= 1 for ks in _drive_rows(calm, 1, 100, lambda b, t: 0.05 + 0.002 * t, draft))


def test_the_recheck_waits_for_a_step_that_can_measure_the_plain_step():
    """A batch ramps up one prefill chunk at a time: the policy weighs the admitted load (8) while fewer rows decode,
    and their plain steps are measured at their own row count. Forcing k = 0 for a recheck at B = 8 during the ramp
    measured nothing, so every ramp step was a plain step (10 of 37 steps of each B = 8 wave with the fp32 target,
    where fixed:4 drafted through the ramp and ran 3-6% ahead). The recheck now waits for a step of 8 rows; the
    load's first full steps measure what aged: a verify of drafts (a probe) and the plain step."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    verify = lambda b, t: 0.20 * (1 + 0.3 * (t - 1)) if b == 8 else 0.05 * b * (1 + 0.2 * (t - 1))  # noqa: E731
    draft = lambda rows: 0.01 * rows                                  # noqa: E731
    first = lambda i: i < 1                                           # noqa: E731  (only a first draft is accepted)
    _drive_rows(policy, 1, 30, verify, draft, accept=first)
    during = _drive_rows(policy, 8, 40, verify, draft, accept=first)
    assert sum(1 for ks in during[-10:] if min(ks) >= 1) >= 9        # k = 1 wins at B = 8, by 18%
    _drive_rows(policy, 1, 2 * policy.recheck_after, verify, draft, accept=first)   # B = 8's plain step ages
    assert policy.costs.age(8, 1) > policy.recheck_after
    ramp = []
    for rows in range(1, 8):                                          # rows 1..7 decode, 8 admitted
        k = policy.next_k(8, batch=8, rows=rows)
        policy.observe_costs(k, draft(rows) * k, verify(rows, k + 1), rows * (k + 1), rows)
        for _ in range(rows):
            policy.observe_acceptance(k, min(k, 1))
        ramp.append(k)
    assert min(ramp) >= 1, ramp                                       # speculates through the ramp
    full = _drive_rows(policy, 8, 3, verify, draft, accept=first)
    assert 1 <= sum(1 for k in full[0] if k) <= 2, full               # the first full steps re-measure a narrow
    assert full[1] == [0] * 8, full                                   # win: its verify of drafts (a probe), then
    assert policy.costs.age(8, 1) <= 1 and policy.costs.age(8, 2) <= 2   # its plain step
    assert min(full[2]) >= 1, full                                    # then every row speculates again


def test_switching_on_weighs_a_fresh_plain_step_against_a_fresh_verify_of_drafts():
    """The machine slows by 30% between the probe that measured 2 tokens a row at B = 4 and the plain steps measured
    there since: weighed against each other, k = 2 wins by about a fifth on paper though every k > 0 loses by 10% or
    more at either speed (every draft accepted). On the int4 pair a plain step measured in a slow burst (0.176 s)
    against a 2-token verify measured before it (0.188 s) ran whole waves of 4 at k > 0 where target-only was 20%
    faster. Where the verify of drafts is older than `recheck_after` steps, a probe measures it again before any
    row speculates."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    speed = [1.0]
    verify = lambda b, t: speed[0] * (0.046 + 0.004 * (t - 1) if b == 1 else 0.03 * b * (1 + 0.9 * (t - 1)))  # noqa
    draft = lambda rows: speed[0] * 0.01 * rows                       # noqa: E731
    _drive_rows(policy, 1, 30, verify, draft)
    _drive_rows(policy, 4, 40, verify, draft)                         # the probe measures T = 2: off at B = 4
    assert policy.costs.measured(4, 2) and policy.off
    speed[0] = 1.3
    _drive_rows(policy, 4, 40, verify, draft)                         # plain steps only, at the slower speed
    assert policy.costs.age(4, 2) > policy.recheck_after
    _drive_rows(policy, 3, 1, verify, draft)                          # a row leaves and joins: B = 4 is weighed again
    back = _drive_rows(policy, 4, 30, verify, draft)
    assert all(sum(1 for k in ks if k) <= 2 for ks in back), back     # probes of one or two rows, never all four
    assert policy.costs.age(4, 2) < 30 and policy.off


def test_a_size_left_speculating_resumes_without_a_probe():
    """Where speculation was on, winning clearly, when the load left a batch size, every row speculates at once when
    the load comes back (a probe on each return would cost a step at every size a wave's drain passes through); a
    narrow win is probed again (the test above)."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    flat = lambda b, t: 0.01 + 0.0005 * b * t                         # noqa: E731
    draft = lambda rows: 0.001 + 0.0001 * rows                        # noqa: E731
    _drive_rows(policy, 1, 30, flat, draft)
    assert all(min(ks) >= 2 for ks in _drive_rows(policy, 4, 30, flat, draft)[-10:])
    _drive_rows(policy, 1, 2 * policy.recheck_after, flat, draft)    # B = 4's costs age together
    assert policy.costs.drafts_age(4) > policy.recheck_after
    back = _drive_rows(policy, 4, 5, flat, draft)
    assert all(min(ks) >= 2 for ks in back), back


def test_a_ramp_whose_rows_hold_their_text_is_weighed_for_those_rows():
    """While 8 sequences prefill one chunk at a time, 1..7 rows decode. Where their drafts hold their text (no
    catch-up), the step's k only decides that step's cost: it is weighed for the rows that run it, where
    speculation pays more than at the full load. Rows whose drafts are behind keep the load's verdict (at a load
    too large for speculation, a ramp weighed for its few rows turned speculation on with a catch-up per row)."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    draft = lambda rows: 0.018 * rows                                 # noqa: E731
    for rows in (1, 2, 8):
        _drive_rows(policy, rows, 40, _cpu_like_verify, draft)       # measured alone, at 2 and at 8
    assert policy.next_k(8, batch=8) == 0                            # the full load: off
    assert policy.next_k(8, batch=8, rows=2, rows_fed=False) == 0    # drafts behind: the load's verdict
    assert policy.next_k(8, batch=8, rows=1, rows_fed=True) >= 4     # fed: weighed for one row
    assert policy.next_k(8, batch=8, rows=3, rows_fed=True) == 0     # never measured at 3 rows: the load's
    assert policy.off and policy.last_batch == 8                     # the load's own state untouched


def test_a_ramp_speculates_for_its_rows_only_on_a_clear_win():
    """A ramp meets each row count for a step or two, so what it weighs there was measured long before and nothing
    rechecks it: on the int4 pair at 16 clients, ramps ran k = 2 at 4-15 rows on narrow wins measured one cell
    earlier (38 tok/s where the plain steps ran 64). A narrow win at the ramp's rows leaves the load's verdict."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    verify = lambda b, t: 0.046 + 0.004 * (t - 1) if b == 1 else 0.025 * b * (1 + (0.5 if b == 4 else 0.7) * (t - 1))  # noqa: E731
    draft = lambda rows: 0.01 * rows                                  # noqa: E731
    for rows in (1, 4, 8):
        _drive_rows(policy, rows, 40, verify, draft)
    rate = policy._rates([policy.step_cost(k, 4) for k in range(9)], 4)
    assert policy._best(rate) > 0 and max(rate) < RECHECK_MARGIN * rate[0]   # 4 rows: k > 0 wins, narrowly
    assert policy.next_k(8, batch=8) == 0                            # the full load: off
    assert policy.next_k(8, batch=8, rows=4, rows_fed=True) == 0     # a narrow win at the ramp's rows: the load's
    assert policy.next_k(8, batch=8, rows=1, rows_fed=True) >= 4     # a clear one (alone): weighed for its row


def test_k_grows_a_measured_verify_width_at_a_time():
    """At B = 8 on the int4 pair a probe measured T = 2 at 1.43x T = 1; the line through them put T = 6 at 3.1x, k = 5
    won on paper by 18%, and the step ran at 3.5x plus draft calls over 8 rows that 1 and 2 rows had put at
    two thirds of their cost: 22 tok/s where plain steps ran 53. k now grows at most one width past the widest
    verify measured at its batch size. Here wider verifies cost more than the line through T = 1, 2 says: k = 1
    is the best (+12%), k = 5 looks best on paper after the probe."""
    policy = AdaptivePolicy(max_draft=8, probe_every=16)
    verify = lambda b, t: 0.046 + 0.004 * (t - 1) if b == 1 else (                   # noqa: E731
        0.15 * (1 + 0.43 * (t - 1)) if t <= 2 else 0.15 * (1.43 + 0.6 * (t - 2)))
    draft = lambda rows: 0.018 + 0.005 * (rows - 1)                                  # noqa: E731
    accept = lambda i: i < 6                                                         # noqa: E731
    _drive_rows(policy, 1, 30, verify, draft, accept)
    ks = []
    for _ in range(60):
        widest = policy.costs.widest(8)
        step = _drive_rows(policy, 8, 1, verify, draft, accept)[0]
        assert max(step) <= max(widest, 1), (ks, step, widest)       # never past one width beyond the measured
        ks.append(max(step))
    assert max(ks) <= 3, ks                                          # the measured widths stop the growth
    assert sorted(ks[-20:])[10] == 1, ks                             # and k = 1 runs, exploration aside
