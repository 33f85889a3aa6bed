"""Blackjack from images: Gymnasium's rules and dealing (natural=False), drawn as cards.

The game itself is Gymnasium's `BlackjackEnv`; this env draws its state: the dealer's up
card beside a face-down card, and the player's cards. Card values come from Gymnasium
(tens for J, Q and K); suits are drawn from the env's own seeded generator.
"""

from __future__ import annotations

from gymnasium.envs.toy_text.blackjack import BlackjackEnv as GymnasiumBlackjack

from fleetrl.envs.gym_cards import render
from fleetrl.envs.gym_cards.base import CardsEnv


class BlackjackEnv(CardsEnv):
    ACTIONS = ("stand", "hit")

    def __init__(self, image_size: int = 300):
        super().__init__(image_size)
        self.game = GymnasiumBlackjack(natural=False, sab=False)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.game.reset(seed=int(self.np_random.integers(2**31)))
        self._suits = [render.SUITS[int(i)] for i in self.np_random.integers(4, size=32)]
        return self._observe()

    def step(self, action):
        _, reward, terminated, truncated, _ = self.game.step(int(action))
        obs, info = self._observe()
        return obs, float(reward), terminated, truncated, info

    def text(self) -> str:
        player = ", ".join(str(c) for c in self.game.player)
        return f"Dealer: {self.game.dealer[0]}, ?\nPlayer: {player} (sum {sum(self.game.player)})"

    def draw(self):
        image, draw = render.canvas()
        render.text_line(draw, 22, "Dealer", size=22, bold=1)
        render.card(draw, 80, 40, 60, 84, self.game.dealer[0], self._suits[0])
        render.card(draw, 160, 40, 60, 84, None, None)
        render.text_line(draw, 160, "Player", size=22, bold=1)
        cards = self.game.player
        width = min(60, (render.CANVAS - 20) / len(cards) - 8)
        start = (render.CANVAS - len(cards) * (width + 8)) / 2
        for i, value in enumerate(cards):
            render.card(draw, start + i * (width + 8), 180, width, width * 1.4, value, self._suits[1 + i])
        return image
