"""EZPoints and Points24: build a formula from the cards that equals the target.

The cards are dealt face up; J, Q and K count as 10. Each action appends a token to the
formula: a number (a card's value, each card once), an operator, or "=", which evaluates it.

- a number that is not an unused card: -1, and the episode goes on;
- "=": +10 if the formula equals the target and uses every card, else -1; the episode ends;
- a formula longer than `max_tokens`: -1, and the episode is truncated.
"""

from __future__ import annotations

from fleetrl.envs.gym_cards import render
from fleetrl.envs.gym_cards.arithmetic import FormulaError, evaluate, solvable
from fleetrl.envs.gym_cards.base import CardsEnv

NUMBERS = tuple(str(n) for n in range(1, 11))


def card_value(rank: int) -> int:
    return min(rank, 10)


class FormulaEnv(CardsEnv):
    TARGET = 0
    MAX_TOKENS = 0

    def __init__(self, image_size: int = 300):
        super().__init__(image_size)

    def deal(self) -> list[int]:
        """Card ranks, 1-13."""
        raise NotImplementedError

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ranks = self.deal()
        self.suits = [render.SUITS[int(i)] for i in self.np_random.integers(4, size=len(self.ranks))]
        self.unused = [card_value(r) for r in self.ranks]
        self.formula: list[str] = []
        return self._observe()

    def step(self, action):
        token = self.ACTIONS[int(action)]
        if token in NUMBERS:
            if int(token) not in self.unused:
                obs, info = self._observe()
                return obs, -1.0, False, False, info
            self.unused.remove(int(token))
        self.formula.append(token)
        if token == "=":
            try:
                correct = evaluate(self.formula[:-1]) == self.TARGET and not self.unused
            except FormulaError:
                correct = False
            obs, info = self._observe()
            return obs, 10.0 if correct else -1.0, True, False, info
        obs, info = self._observe()
        if len(self.formula) > self.MAX_TOKENS:
            return obs, -1.0, False, True, info
        return obs, 0.0, False, False, info

    def text(self) -> str:
        cards = ", ".join(render.rank_name(r) for r in self.ranks)
        return f"Cards: {cards}\nFormula: {''.join(self.formula)}"

    def draw(self):
        image, draw = render.canvas()
        count = len(self.ranks)
        width = 56 if count > 2 else 80
        gap = (render.CANVAS - count * width) / (count + 1)
        for i, (rank, suit) in enumerate(zip(self.ranks, self.suits)):
            render.card(draw, gap + i * (width + gap), 50, width, width * 1.4, rank, suit)
        render.text_line(draw, 245, "Formula: " + "".join(self.formula), size=34, bold=2)
        return image


class EZPointsEnv(FormulaEnv):
    """Two cards that make 12 by + or *."""

    ACTIONS = NUMBERS + ("+", "*", "=")
    TARGET = 12
    MAX_TOKENS = 5

    def deal(self) -> list[int]:
        while True:
            ranks = [int(r) for r in self.np_random.integers(1, 14, size=2)]
            a, b = (card_value(r) for r in ranks)
            if a + b == 12 or a * b == 12:
                return ranks


class Points24Env(FormulaEnv):
    """Four cards and 24; with `solvable_only`, only hands that can make 24."""

    ACTIONS = NUMBERS + ("+", "-", "*", "/", "(", ")", "=")
    TARGET = 24
    MAX_TOKENS = 20

    def __init__(self, image_size: int = 300, solvable_only: bool = False):
        super().__init__(image_size)
        self.solvable_only = solvable_only

    def deal(self) -> list[int]:
        while True:
            ranks = [int(r) for r in self.np_random.integers(1, 14, size=4)]
            if not self.solvable_only or solvable(tuple(sorted(card_value(r) for r in ranks)), self.TARGET):
                return ranks
