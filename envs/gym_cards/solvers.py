"""A solver for each gym_cards task: a short chain of thought and the correct next action.

A solver reads an env's state (the unwrapped `CardsEnv`) and answers as a vision-language
agent is asked to, `{"thoughts": "...", "action": "..."}`, with the action one of the
env's legal action strings:

- NumberLine: step toward the target.
- EZPoints: the formula of the two cards that makes 12 (a sum or a product), token by token.
- Points24: a formula of the four cards that makes 24, found by search, token by token; on
  a deal with none, or once the formula so far has left every solution, "=" ends it.
- Blackjack: basic strategy for hitting or standing (no doubling or splitting here).

Solvers are the oracles of teacher forcing and the demonstrations of warm starts.
"""

from __future__ import annotations

import dataclasses
import json

from fleetrl.envs.gym_cards.arithmetic import formula_for
from fleetrl.envs.gym_cards.base import CardsEnv
from fleetrl.envs.gym_cards.blackjack import BlackjackEnv
from fleetrl.envs.gym_cards.formula import EZPointsEnv, FormulaEnv, card_value
from fleetrl.envs.gym_cards.numberline import NumberLineEnv


@dataclasses.dataclass(frozen=True)
class Answer:
    thoughts: str
    action: str  # one of the env's legal action strings

    def text(self) -> str:
        """The answer in the prompts' output format."""
        return json.dumps({"thoughts": self.thoughts, "action": self.action})


def solve(env: CardsEnv) -> Answer:
    """The solver's answer for `env`'s current state."""
    if isinstance(env, NumberLineEnv):
        return _numberline(env)
    if isinstance(env, FormulaEnv):
        return _formula(env)
    if isinstance(env, BlackjackEnv):
        return _blackjack(env)
    raise TypeError(f"no solver for {type(env).__name__}")


def _numberline(env: NumberLineEnv) -> Answer:
    move = "add one" if env.current < env.target else "subtract one"
    return Answer(f"The target is {env.target} and the current number is {env.current}, so I {move}.",
                  "+" if env.current < env.target else "-")


def _formula(env: FormulaEnv) -> Answer:
    values = tuple(card_value(r) for r in env.ranks)
    operators = "+*" if isinstance(env, EZPointsEnv) else "+-*/"
    cards = ", ".join(str(v) for v in values)
    solution = formula_for(values, env.TARGET, operators)
    if solution is None:
        return Answer(f"The cards are {cards}. No formula of them makes {env.TARGET}, so I end it.", "=")
    written = " ".join(solution)
    sequence = (*solution, "=")
    done = tuple(env.formula)
    if len(done) >= len(sequence):  # the episode's last state: the formula has been ended
        return Answer(f"The cards are {cards} and the formula {''.join(done)} is complete, so I end it.", "=")
    if sequence[:len(done)] != done:
        return Answer(f"The cards are {cards} and {written} = {env.TARGET}, but the formula so far is "
                      f"{''.join(done)}, so I end it.", "=")
    token = sequence[len(done)]
    return Answer(f"The cards are {cards}. {written} = {env.TARGET}. The formula so far is "
                  f"'{''.join(done)}', so the next token is {token}.", token)


def _blackjack(env: BlackjackEnv) -> Answer:
    player, dealer = env.game.player, env.game.dealer[0]
    total = sum(player)
    soft = 1 in player and total + 10 <= 21
    if soft:
        total += 10
        hit = total <= 17 or (total == 18 and dealer in (9, 10, 1))
    else:
        hit = total <= 11 or (total == 12 and dealer not in (4, 5, 6)) or (13 <= total <= 16 and not 2 <= dealer <= 6)
    shown = "an ace" if dealer == 1 else str(dealer)
    hand = f"{total}{' with an ace counted as 11' if soft else ''}"
    return Answer(f"My cards make {hand} and the dealer shows {shown}, so basic strategy says "
                  f"{'hit' if hit else 'stand'}.", "hit" if hit else "stand")
