"""A small navigation task with an oracle: walk to a goal on a grid.

The observation shows the agent's and the goal's cells (one-hot), and, as VALAN's
navigation envs do, the oracle's next action (a step along a shortest path) under
"oracle_action", for teacher forcing. The reward is 1 on reaching the goal, which ends the
episode; the step cap truncates it. Registered as `fleetrl/GridNav-v0`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)])  # up, down, left, right


class GridNavEnv(gym.Env):
    def __init__(self, size: int = 9, max_steps: int = 24):
        self.size, self.max_steps = size, max_steps
        self.observation_space = gym.spaces.Dict({
            "observation": gym.spaces.Box(0.0, 1.0, (2 * size * size,), np.float32),
            "oracle_action": gym.spaces.Discrete(len(MOVES)),
        })
        self.action_space = gym.spaces.Discrete(len(MOVES))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        cells = self.np_random.choice(self.size * self.size, size=2, replace=False)
        self.position, self.goal = np.array(divmod(cells[0], self.size)), np.array(divmod(cells[1], self.size))
        self.steps = 0
        return self._observe(), {"success": False}

    def step(self, action):
        self.position = np.clip(self.position + MOVES[int(action)], 0, self.size - 1)
        self.steps += 1
        success = bool((self.position == self.goal).all())
        return self._observe(), float(success), success, self.steps >= self.max_steps, {"success": success}

    def oracle_action(self) -> int:
        delta = self.goal - self.position
        axis = int(np.argmax(np.abs(delta)))
        if delta[axis] == 0:
            return 0
        return (0 if delta[0] < 0 else 1) if axis == 0 else (2 if delta[1] < 0 else 3)

    def _observe(self) -> dict:
        grid = np.zeros((2, self.size, self.size), np.float32)
        grid[0][tuple(self.position)] = 1.0
        grid[1][tuple(self.goal)] = 1.0
        return {"observation": grid.reshape(-1), "oracle_action": np.int64(self.oracle_action())}


gym.register("fleetrl/GridNav-v0", entry_point=GridNavEnv)
