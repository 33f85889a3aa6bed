"""The formula solvers (EZPoints, Points24) against the env's own arithmetic and an
independent brute force: every answer evaluates to the target and uses each card once,
and a deal is called unsolvable exactly when nothing makes the target."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from fleetrl.envs.gym_cards.arithmetic import evaluate, formula_for, solvable
from fleetrl.envs.gym_cards.formula import NUMBERS, EZPointsEnv, Points24Env, card_value


def play(env, tokens) -> float:
    """Plays `tokens` and "=" through the env; the last reward."""
    reward = 0.0
    for token in (*tokens, "="):
        _, reward, terminated, truncated, _ = env.step(env.ACTIONS.index(token))
    assert terminated and not truncated
    return reward


def assert_uses_each_card_once(tokens, values):
    assert Counter(int(t) for t in tokens if t in NUMBERS) == Counter(values), (tokens, values)


EZPOINTS_DEALS = [(a, b) for a in range(1, 14) for b in range(1, 14)
                  if card_value(a) + card_value(b) == 12 or card_value(a) * card_value(b) == 12]


def test_ezpoints_has_the_deals_it_should():
    # Sums to 12 from values 2-10 (J, Q, K are 10), and 2x6, 3x4 and their mirrors.
    values = {(card_value(a), card_value(b)) for a, b in EZPOINTS_DEALS}
    assert (2, 10) in values and (10, 2) in values and (3, 4) in values and (6, 6) in values
    assert (1, 11) not in values and (1, 12) not in values  # no card is worth 11 or 12
    assert len(EZPOINTS_DEALS) == 19  # 2 with 10, J, Q or K (8, both orders), 3+9, 4+8, 5+7, 6+6, 2x6, 3x4


@pytest.mark.parametrize("ranks", EZPOINTS_DEALS)
def test_the_ezpoints_solver_solves_every_deal(ranks):
    values = tuple(card_value(r) for r in ranks)
    tokens = formula_for(values, 12, "+*")
    assert tokens is not None and evaluate(tokens) == 12
    assert_uses_each_card_once(tokens, values)
    assert set(tokens) <= set(EZPointsEnv.ACTIONS) and len(tokens) + 1 <= EZPointsEnv.MAX_TOKENS

    env = EZPointsEnv(image_size=16)
    env.reset(seed=0)
    env.ranks, env.unused, env.formula = list(ranks), list(values), []
    assert play(env, tokens) == 10.0


@functools.cache
def reachable(values: tuple[int, ...]) -> frozenset[Fraction]:
    """Every value that +, -, *, / make from all of `values` (a sorted tuple), each once.
    Independent of the solvers: it splits the multiset into two parts in every way and
    combines their value sets, rather than reducing pairs of numbers one at a time."""
    if len(values) == 1:
        return frozenset({Fraction(values[0])})
    results: set[Fraction] = set()
    indices = range(len(values))
    for size in range(1, len(values)):
        for left in itertools.combinations(indices, size):
            right = tuple(values[i] for i in indices if i not in left)
            for a in reachable(tuple(values[i] for i in left)):
                for b in reachable(right):
                    results.update((a + b, a - b, a * b))
                    if b:
                        results.add(a / b)
    return frozenset(results)


def test_the_count_of_solvable_points24_deals_matches_an_independent_brute_force():
    hands = list(itertools.combinations_with_replacement(range(1, 11), 4))
    by_brute_force = {hand for hand in hands if Fraction(24) in reachable(hand)}
    by_solver = {hand for hand in hands if formula_for(hand, 24, "+-*/") is not None}
    assert by_solver == by_brute_force
    assert {hand for hand in hands if solvable(hand)} == by_brute_force  # the env's solvable_only
    # The published count for four numbers from 1 to 10: 566 of the 715 multisets make 24.
    assert (len(by_brute_force), len(hands)) == (566, 715)


def test_the_points24_solver_solves_1000_random_deals_or_says_there_is_none():
    env = Points24Env(image_size=16)
    rng = np.random.default_rng(24)
    unsolvable = 0
    for deal in range(1000):
        ranks = [int(r) for r in rng.integers(1, 14, size=4)]
        values = tuple(card_value(r) for r in ranks)
        tokens = formula_for(values, 24, "+-*/")
        if tokens is None:
            assert Fraction(24) not in reachable(tuple(sorted(values)))
            unsolvable += 1
            continue
        assert evaluate(tokens) == 24
        assert_uses_each_card_once(tokens, values)
        assert set(tokens) <= set(Points24Env.ACTIONS) and len(tokens) + 1 <= Points24Env.MAX_TOKENS
        if deal < 100:  # and through the env itself (each step draws its image: a hundred will do)
            env.reset(seed=0)
            env.ranks, env.unused, env.formula = ranks, list(values), []
            assert play(env, tokens) == 10.0
    # Deals are of ranks 1-13, so tens are common; about a fifth of them have no solution.
    assert 100 < unsolvable < 350


def _in_order(values: tuple[int, ...]) -> frozenset[Fraction]:
    """Every value of a formula that keeps `values` in this order."""
    if len(values) == 1:
        return frozenset({Fraction(values[0])})
    results = set()
    for split in range(1, len(values)):
        for a in _in_order(values[:split]):
            for b in _in_order(values[split:]):
                results.update((a + b, a - b, a * b))
                if b:
                    results.add(a / b)
    return frozenset(results)


def test_the_points24_solver_keeps_the_cards_order_whenever_some_formula_does():
    """The numbers of its formula follow the cards left to right unless no formula in that
    order makes 24, so an agent that imitates it mostly reads the next card."""
    assert formula_for((1, 2, 3, 4), 24, "+-*/") == ("(", "(", "1", "+", "2", ")", "+", "3", ")", "*", "4")
    rng = np.random.default_rng(7)
    kept = reordered = 0
    for _ in range(300):
        values = tuple(int(v) for v in rng.integers(1, 11, size=4))
        tokens = formula_for(values, 24, "+-*/")
        if tokens is None:
            continue
        numbers = tuple(int(t) for t in tokens if t.isdigit())
        if Fraction(24) in _in_order(values):
            assert numbers == values, (values, tokens)
            kept += 1
        else:
            assert sorted(numbers) == sorted(values) and numbers != values
            reordered += 1
    assert kept > 100 and reordered > 30  # both cases were exercised
