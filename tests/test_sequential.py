"""The sequential A/B's promises: regression at 0% at most alpha, pass at the minimum effect at
most beta, whatever the noise and wherever it stops; its interval agrees with its decision."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.judge import sequential
from perfsuite.judge.sequential import PASS, REGRESSION, UNDECIDED, Design, assess, decide

DRAWS = 20_000


def rates(design: Design, slowdown: float, sigma: float, seed: int = 7) -> tuple[float, float, float]:
    """P(regression), P(pass), P(undecided) over ``DRAWS`` A/Bs with normal losses (a new seed:
    not the draws the levels were computed from)."""
    losses = math.log1p(slowdown) + sigma * np.random.default_rng(seed).standard_normal((DRAWS, design.max_pairs))
    code, _ = decide(design, losses)
    return float(np.mean(code == REGRESSION)), float(np.mean(code == PASS)), float(np.mean(code == UNDECIDED))


@pytest.mark.parametrize("sigma", [0.001, 0.01, 1.0])
def test_false_alarms_and_missed_slowdowns_stay_within_alpha_and_beta_whatever_the_noise(sigma: float) -> None:
    design = Design(min_effect=0.02)
    slack = 3 * math.sqrt(0.05 * 0.95 / DRAWS)  # 3 binomial sigma at 5%
    regression_at_zero, _, _ = rates(design, 0.0, sigma)
    _, pass_at_effect, _ = rates(design, 0.02, sigma)
    assert regression_at_zero <= design.alpha + slack
    assert pass_at_effect <= design.beta + slack
    if sigma == 1.0:  # noise that swamps the effect: the bound is reached, not just respected
        assert regression_at_zero == pytest.approx(design.alpha, abs=slack)


def test_testing_every_look_at_the_plain_level_would_break_the_promise() -> None:
    # The planted fault: repeated looks at the nominal alpha itself. Its false alarms exceed alpha,
    # which is what the adjusted levels are for.
    design = Design(min_effect=0.02)
    naive = sequential.Levels(design.alpha, design.beta)
    original = sequential.nominal_levels
    try:
        sequential.nominal_levels = lambda *args: naive  # type: ignore[assignment]
        regression_at_zero, _, _ = rates(design, 0.0, 1.0)
    finally:
        sequential.nominal_levels = original  # type: ignore[assignment]
    assert regression_at_zero > design.alpha * 1.5


def test_a_typical_h100_pair_decides_two_percent_in_about_four_pairs() -> None:
    # 0.87% per pair: two launches each 0.62% (selftest --simulate's typical H100 row).
    design = Design(min_effect=0.02)
    losses = math.log1p(0.02) + 0.0087 * np.random.default_rng(3).standard_normal((DRAWS, design.max_pairs))
    code, pairs = decide(design, losses)
    assert np.mean(code == REGRESSION) >= 0.9 and np.mean(pairs) <= 4.5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-0.5, 0.5, allow_nan=False), min_size=1, max_size=8), st.floats(0.01, 0.5))
def test_the_interval_says_what_the_decision_says(losses: list[float], effect: float) -> None:
    design = Design(min_effect=effect)
    state = assess(design, losses)
    code, spent = decide(design, np.asarray([losses]))
    assert state.decision == sequential.DECISIONS[int(code[0])] or (state.decision, code[0]) == ("continue", 0)
    if state.decision == "regression":
        assert state.low > 0 and state.pairs == spent[0]
    if state.decision == "pass":
        assert state.high < effect
    if state.decision == "continue" and len(losses) >= design.first_look:
        assert state.low <= 0 or state.high >= effect


def test_the_last_look_or_a_spent_budget_is_undecided() -> None:
    design = Design(min_effect=0.02, max_pairs=3)
    wide = [0.05, -0.05, 0.04]
    assert assess(design, wide[:2]).decision == "continue"
    assert assess(design, wide[:2], final=True).decision == "undecided"
    assert assess(design, wide).decision == "undecided"
    with pytest.raises(ValueError, match="1 to 3 pairs"):
        assess(design, [*wide, 0.0])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_effect": 0.0}, "min_effect must be a slowdown fraction above 0"),
        ({"min_effect": 0.02, "alpha": 0.7}, r"alpha must be in \(0, 0.5\)"),
        ({"min_effect": 0.02, "max_pairs": 1}, "need 2 <= first_look <= max_pairs"),
    ],
)
def test_a_bad_design_names_its_field(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Design(**fields)  # type: ignore[arg-type]


def test_losses_and_order() -> None:
    assert sequential.loss(100.0, 100.0 / 1.1, higher_is_better=True) == pytest.approx(math.log(1.1))
    assert sequential.loss(100.0, 110.0, higher_is_better=False) == pytest.approx(math.log(1.1))
    assert [sequential.base_first(pair) for pair in range(4)] == [True, False, True, False]
