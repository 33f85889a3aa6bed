"""The env's own description of its state, as an observation a text-reading agent can use.

RL4VLM's prompts have a place for observation-dependent text where a task has some.
`ObservationText` puts `info["text"]` (which every gym_cards env writes) into the
observation as zero-padded UTF-8 bytes, `observation_text` and `observation_text_length`,
cut to `max_bytes` at a whole character; a vision-language agent writes it into its prompt.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.text_actions import encode_text

OBSERVATION_TEXT, OBSERVATION_TEXT_LENGTH = "observation_text", "observation_text_length"


class ObservationText(gym.Wrapper):
    def __init__(self, env: gym.Env, max_bytes: int = 128, info_key: str = "text"):
        super().__init__(env)
        if not isinstance(env.observation_space, gym.spaces.Dict):
            raise ValueError(f"observation text goes into a Dict observation, not "
                             f"{type(env.observation_space).__name__}")
        self.max_bytes, self.info_key = max_bytes, info_key
        self.observation_space = gym.spaces.Dict({
            **env.observation_space.spaces,
            OBSERVATION_TEXT: gym.spaces.Box(0, 255, (max_bytes,), np.uint8),
            OBSERVATION_TEXT_LENGTH: gym.spaces.Box(0, max_bytes, (), np.int64),
        })

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._observe(obs, info), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(obs, info), reward, terminated, truncated, info

    def _observe(self, obs: dict[str, np.ndarray], info: dict[str, Any]) -> dict[str, np.ndarray]:
        if self.info_key not in info:
            raise ValueError(f"observation text: the env's info has no {self.info_key!r}")
        text, length = encode_text(str(info[self.info_key]), self.max_bytes)
        return {**obs, OBSERVATION_TEXT: text, OBSERVATION_TEXT_LENGTH: np.int64(length)}
