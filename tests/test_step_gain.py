import pytest

from specedge.bench.step_gain import plain_step_s, speculation_effect


def _step(rows, k, accepted, seconds):
    return {"batch": rows, "k": [k] * rows, "accepted": accepted, "draft_s": 0.25 * seconds,
            "verify_s": 0.75 * seconds}


def test_a_speculative_step_is_priced_by_the_cells_own_plain_steps_of_as_many_rows():
    plain = [_step(4, 0, [0] * 4, s) for s in (0.19, 0.20, 0.24)]                   # median 0.20 s for 4 tokens
    won = _step(4, 2, [2, 2, 1, 0], 0.30)       # 9 tokens: 9 / 4 x 0.20 = 0.45 s as plain steps, took 0.30
    lost = _step(4, 4, [0, 0, 0, 1], 0.50)      # 5 tokens: 0.25 s as plain steps, took 0.50
    assert plain_step_s(plain + [won]) == {4: pytest.approx(0.20)}
    got = speculation_effect(plain + [won, lost])
    assert got["gain_s"] == pytest.approx(0.15 - 0.25)
    assert got["gain_share"] == pytest.approx(-0.10 / (0.63 + 0.30 + 0.50))
    assert got["unpriced_steps"] == 0
    assert speculation_effect(plain) == {"gain_s": 0.0, "gain_share": 0.0, "unpriced_steps": 0}


def test_rows_never_run_plain_in_the_cell_take_the_fallback_price_or_are_left_out():
    steps = [_step(3, 1, [1, 1, 0], 0.20), _step(2, 0, [0, 0], 0.10)]
    alone = speculation_effect(steps)
    assert alone["unpriced_steps"] == 1 and alone["gain_s"] == 0.0
    priced = speculation_effect(steps, fallback={3: 0.12, 2: 0.5})     # the cell's own 2-row price wins
    assert priced["unpriced_steps"] == 0
    assert priced["gain_s"] == pytest.approx(5 / 3 * 0.12 - 0.20)
