"""A user's own Problem with a bug in it: the worked example of docs/debugging.md.

The agent walks a corridor of `length` cells from cell 0; reaching the last one should pay
1 and end the episode. The env below never pays it (the bug the page finds, step by step).
Run it as `--problem=corridor:CorridorProblem` with this folder on PYTHONPATH.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np

from fleetrl.agents import MLPAgent
from fleetrl.problems.base import Problem, ProblemConfig


class CorridorEnv(gym.Env):
    """Action 1 steps right, 0 steps left; the observation is the agent's cell, one-hot."""

    def __init__(self, length: int = 5, max_steps: int = 20):
        self.length, self.max_steps = length, max_steps
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.steps = 0, 0
        return self._observation(), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if action == 1 else -1))
        self.steps += 1
        terminated = self.position == self.length
        if terminated:
            self.position = 0  # back to the start for the next episode
        reward = 1.0 if self.position == self.length else 0.0
        return self._observation(), reward, terminated, self.steps >= self.max_steps, {}

    def _observation(self) -> np.ndarray:
        return np.eye(self.length + 1, dtype=np.float32)[self.position]


@dataclasses.dataclass
class CorridorConfig(ProblemConfig):
    length: int = 5
    max_episode_steps: int = 20
    learning_rate: float = 3e-3


class CorridorProblem(Problem):
    name = "corridor"
    Config = CorridorConfig

    def make_env(self) -> gym.Env:
        return CorridorEnv(self.config.length, self.config.max_episode_steps)

    def make_agent(self) -> MLPAgent:
        (observation,) = self.observation_specs()
        return MLPAgent(observation.shape[0], self.action_policy().policy_logits_size(), (32,))
