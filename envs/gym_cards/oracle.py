"""The solver as an oracle in the observation: its action, and its answer as text.

`SolverOracle` adds to each observation what the solver (`solvers.solve`) would do in that
state: `oracle_action` (the index of the legal action) for agents that pick actions, and
`oracle_text` (its answer `{"thoughts": ..., "action": ...}` as zero-padded UTF-8 bytes)
for agents that write text. Teacher-forced episodes execute it, and warm starts imitate it.

With `accuracy` below 1 the oracle is noisy: in that share of steps it names another legal
action, uniformly, keeping its thoughts (a solver that is right 60% of the time, say), from
a generator of its own seeded by the first seeded reset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.gym_cards.solvers import solve
from fleetrl.envs.text_actions import encode_text

ORACLE_ACTION, ORACLE_TEXT, ORACLE_TEXT_LENGTH = "oracle_action", "oracle_text", "oracle_text_length"


class SolverOracle(gym.Wrapper):
    def __init__(self, env: gym.Env, accuracy: float = 1.0, max_text_bytes: int = 256):
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"solver accuracy must be in [0, 1], got {accuracy}")
        super().__init__(env)
        self.accuracy, self.max_text_bytes = accuracy, max_text_bytes
        self.observation_space = gym.spaces.Dict({
            **env.observation_space.spaces,
            ORACLE_ACTION: gym.spaces.Discrete(env.action_space.n),
            ORACLE_TEXT: gym.spaces.Box(0, 255, (max_text_bytes,), np.uint8),
            ORACLE_TEXT_LENGTH: gym.spaces.Box(0, max_text_bytes, (), np.int64),
        })
        self._noise = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._noise = np.random.default_rng([seed, 0x0AC1E])
        obs, info = self.env.reset(seed=seed, options=options)
        return self._observe(obs, info), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(obs, info), reward, terminated, truncated, info

    def _observe(self, obs: dict[str, np.ndarray], info: dict[str, Any]) -> dict[str, np.ndarray]:
        legal = list(info["legal_actions"])
        answer = solve(self.env.unwrapped)
        if self.accuracy < 1.0 and self._noise.random() >= self.accuracy and len(legal) > 1:
            others = [a for a in legal if a != answer.action]
            answer = dataclasses.replace(answer, action=others[int(self._noise.integers(len(others)))])
        text, length = encode_text(answer.text(), self.max_text_bytes)
        return {**obs, ORACLE_ACTION: np.int64(legal.index(answer.action)), ORACLE_TEXT: text,
                ORACLE_TEXT_LENGTH: np.int64(length)}
