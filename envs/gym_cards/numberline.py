"""NumberLine: move the current position to the target, one step of -1 or +1 at a time."""

from __future__ import annotations

from fleetrl.envs.gym_cards import render
from fleetrl.envs.gym_cards.base import CardsEnv


class NumberLineEnv(CardsEnv):
    ACTIONS = ("-", "+")

    def __init__(self, max_position: int = 5, image_size: int = 300):
        super().__init__(image_size)
        self.max_position = max_position
        self.max_steps = 2 * max_position

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target, self.current = (int(x) for x in self.np_random.choice(self.max_position + 1, 2, replace=False))
        self.steps = 0
        return self._observe()

    def step(self, action):
        before = abs(self.current - self.target)
        self.current = min(max(self.current + (1 if int(action) == 1 else -1), 0), self.max_position)
        self.steps += 1
        after = abs(self.current - self.target)
        terminated = after == 0
        reward = 1.0 if terminated else (-1.0 if after >= before else 0.0)
        obs, info = self._observe()
        return obs, reward, terminated, not terminated and self.steps >= self.max_steps, info

    def text(self) -> str:
        return f"Target: {self.target}\nCurrent: {self.current}"

    def draw(self):
        image, draw = render.canvas(background=(255, 255, 255))
        # Large bold text, as in the original: at 32x32 the digits are still a few pixels wide.
        render.text_line(draw, 95, f"Target: {self.target}", size=58, colour=(0, 0, 0), bold=3)
        render.text_line(draw, 205, f"Current: {self.current}", size=58, colour=(0, 0, 0), bold=3)
        return image
