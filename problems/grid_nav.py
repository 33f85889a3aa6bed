"""Grid navigation with an oracle: RL for some episodes, teacher forcing for the others."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.agents import Agent, MLPAgent
from fleetrl.envs.grid_nav import GridNavEnv
from fleetrl.problems.base import Problem, ProblemConfig


@dataclasses.dataclass
class GridNavConfig(ProblemConfig):
    size: int = 9
    max_steps: int = 24
    hidden_sizes: tuple[int, ...] = (128, 128)
    teacher_forcing_fraction: float = 0.5


class GridNavProblem(Problem):
    name = "grid_nav"
    Config = GridNavConfig

    def make_env(self) -> gym.Env:
        return GridNavEnv(self.config.size, self.config.max_steps)

    def make_agent(self) -> Agent:
        return MLPAgent(2 * self.config.size ** 2, 4, self.config.hidden_sizes, shared_torso=False)

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        return {"success": float(final_info["success"])}

    def episode_metric_names(self) -> tuple[str, ...]:
        return ("success",)

    def render_frame(self, observation: Mapping[str, np.ndarray], env: gym.Env | None = None) -> np.ndarray:
        """The agent in green, the goal in red, 8 pixels a cell."""
        size = self.config.size
        agent, goal = observation["observation"].reshape(2, size, size)
        image = np.full((size, size, 3), 40, np.uint8)
        image[goal > 0] = (220, 50, 50)
        image[agent > 0] = (60, 200, 80)
        return image.repeat(8, axis=0).repeat(8, axis=1)
