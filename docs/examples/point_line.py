"""A user's own continuous Problem for the flow-matching VLA: the worked example of
docs/flow_vla.md ("Another continuous Problem").

A point on the line [-1, 1] must reach a goal that only the image shows (a bright column).
Run it as `--problem=point_line:PointLineProblem` with this folder on PYTHONPATH.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np

from fleetrl.problems.flow_vla import FlowVLAConfig, FlowVLAProblem

SIDE, TEXT_BYTES, SPEED = 32, 24, 0.25
INSTRUCTION = "go to the bright column"


class PointLineEnv(gym.Env):
    def __init__(self, oracle_chunk: int = 0):
        spaces = {
            "image": gym.spaces.Box(0, 255, (SIDE, SIDE, 3), np.uint8),  # uint8 RGB, channels last
            "state": gym.spaces.Box(-1, 1, (1,), np.float32),  # float32 [state_dim]
            "language": gym.spaces.Box(0, 255, (TEXT_BYTES,), np.uint8),  # UTF-8 bytes, zero-padded
        }
        if oracle_chunk:  # the expert's next actions, [chunk_size, action_dim], for teacher forcing
            spaces["oracle_action"] = gym.spaces.Box(-1, 1, (oracle_chunk, 1), np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)  # one action: fleetrl plays the chunks
        self.oracle_chunk = oracle_chunk

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.goal, self.x = self.np_random.uniform(-0.9, 0.9, 2)
        self.steps = 0
        return self._observation(), {}

    def step(self, action):
        self.x = float(np.clip(self.x + SPEED * np.clip(action[0], -1, 1), -1, 1))
        self.steps += 1
        success = abs(self.x - self.goal) < 0.08
        truncated = not success and self.steps >= 10
        info = {"success": float(success)} if success or truncated else {}  # success picks best.pt
        return self._observation(), float(success), success, truncated, info

    def _observation(self) -> dict[str, np.ndarray]:
        image = np.zeros((SIDE, SIDE, 3), np.uint8)
        column = int((self.goal + 1) / 2 * (SIDE - 1))
        image[:, max(column - 1, 0):column + 2] = 255  # 3 px: the tiny model learns it sooner and surer than 1
        language = np.zeros(TEXT_BYTES, np.uint8)
        text = INSTRUCTION.encode()[:TEXT_BYTES]
        language[:len(text)] = np.frombuffer(text, np.uint8)
        obs = {"image": image, "state": np.array([self.x], np.float32), "language": language}
        if self.oracle_chunk:
            x, actions = self.x, np.zeros((self.oracle_chunk, 1), np.float32)
            for k in range(self.oracle_chunk):
                actions[k] = np.clip((self.goal - x) / SPEED, -1, 1)
                x += SPEED * actions[k, 0]
            obs["oracle_action"] = actions
        return obs


@dataclasses.dataclass
class PointLineConfig(FlowVLAConfig):
    chunk_size: int = 4  # actions a chunk plays; the oracle gives as many
    # The base config freezes the prefix and the vision tower, as a real pi0's are worth
    # keeping. The tiny random model (model_path=tiny) has nothing to keep: it learns whole.
    train_prefix: bool = True
    train_vision: bool = True
    learning_rate: float = 1e-3


class PointLineProblem(FlowVLAProblem):
    Config = PointLineConfig
    IMAGE_KEYS = ("image",)  # class attributes; these are FlowVLAProblem's defaults
    STATE_KEY, LANGUAGE_KEY = "state", "language"

    def make_env(self) -> gym.Env:
        c = self.config
        return PointLineEnv(oracle_chunk=c.chunk_size if c.teacher_forcing_fraction > 0 else 0)

    def corpus(self) -> list[str]:
        return [INSTRUCTION]  # the tiny model's tokenizer learns its words from this
