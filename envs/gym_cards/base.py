"""What every gym_cards env shares: an image observation, a text one, and legal actions as text.

The observation is {"image": [S, S, 3] uint8}. `info["text"]` describes the same state in
words and `info["legal_actions"]` lists the action strings (index = action), for agents
that read and write text (see `text_to_action`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from PIL import Image

from fleetrl.envs.gym_cards import render


class CardsEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}
    ACTIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, image_size: int = 300):
        if image_size < 16:
            raise ValueError(f"image_size must be at least 16, got {image_size}")
        self.image_size = image_size
        self.render_mode = "rgb_array"
        self.observation_space = gym.spaces.Dict(
            {"image": gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)})
        self.action_space = gym.spaces.Discrete(len(self.ACTIONS))

    # Subclasses draw their state and describe it.
    def draw(self) -> Image.Image:
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError

    def render(self) -> np.ndarray:
        return render.to_array(self.draw(), self.image_size)

    def _observe(self, **extra: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        info = {"text": self.text(), "legal_actions": list(self.ACTIONS), **extra}
        return {"image": self.render()}, info
