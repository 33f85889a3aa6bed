"""A LIBERO-shaped env that costs almost nothing to step, and its flow-VLA Problem: what the
whole-system GPU bench feeds the learner with, so that what is measured is the learner.

    python -m fleetrl.launch.local --problem=fleetrl.bench.libero_shaped:LiberoShapedProblem ...

Observations are LIBERO's as fleetrl's LIBERO env gives them: two `image_size` px uint8
cameras (main_image, wrist_image), an 8-dim float32 state and a LIBERO-spatial instruction
as 128 UTF-8 bytes; the action is 7-dim. Each env draws a few frames once and cycles them,
so a step is a copy, not a simulation. Episodes last `episode_length` actions and end with
success 1 or 0 at random (a reward to train on, not a task to learn). The chunks are
`chunk_size` actions, as for LIBERO.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np

from fleetrl.common.settings import check_range, setting
from fleetrl.problems.flow_vla import FlowVLAConfig, FlowVLAProblem

INSTRUCTIONS = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "pick up the black bowl from table center and place it on the plate",
    "pick up the black bowl on the cookie box and place it on the plate",
    "pick up the black bowl in the top drawer of the wooden cabinet and place it on the plate",
)
LANGUAGE_BYTES, STATE_DIM, ACTION_DIM, FRAMES = 128, 8, 7, 4


class LiberoShapedEnv(gym.Env):
    def __init__(self, image_size: int = 224, episode_length: int = 40):
        image = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = gym.spaces.Dict({
            "main_image": image, "wrist_image": image,
            "state": gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
            "language": gym.spaces.Box(0, 255, (LANGUAGE_BYTES,), np.uint8)})
        self.action_space = gym.spaces.Box(-1, 1, (ACTION_DIM,), np.float32)
        self.image_size, self.episode_length = image_size, episode_length
        self._frames: np.ndarray | None = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self._frames is None:
            self._frames = self.np_random.integers(0, 256, (FRAMES, 2, self.image_size, self.image_size, 3), np.uint8)
        text = INSTRUCTIONS[int(self.np_random.integers(len(INSTRUCTIONS)))].encode()
        self._language = np.zeros(LANGUAGE_BYTES, np.uint8)
        self._language[:len(text)] = np.frombuffer(text, np.uint8)
        self._state = self.np_random.normal(size=STATE_DIM).astype(np.float32)
        self._steps = 0
        return self._observation(), {}

    def step(self, action):
        self._steps += 1
        self._state = (0.9 * self._state + 0.1 * np.resize(np.asarray(action, np.float32), STATE_DIM))
        done = self._steps >= self.episode_length
        success = float(done and self.np_random.random() < 0.5)
        return self._observation(), success, bool(success), done and not success, (
            {"success": success} if done else {})

    def _observation(self) -> dict[str, np.ndarray]:
        frame = self._frames[self._steps % FRAMES]
        return {"main_image": frame[0], "wrist_image": frame[1], "state": self._state.copy(),
                "language": self._language}


@dataclasses.dataclass
class LiberoShapedConfig(FlowVLAConfig):
    image_size: int = setting(224, "The cameras' side, in pixels (LIBERO's are 256 or 224).")
    episode_length: int = setting(40, "Actions an episode lasts (chunk_size to a chunk).")
    variant: str = "pi05"

    def __post_init__(self):
        super().__post_init__()
        check_range("image_size", self.image_size, low=1)
        check_range("episode_length", self.episode_length, low=1)


class LiberoShapedProblem(FlowVLAProblem):
    Config = LiberoShapedConfig
    IMAGE_KEYS = ("main_image", "wrist_image")

    def make_env(self) -> gym.Env:
        return LiberoShapedEnv(self.config.image_size, self.config.episode_length)

    def corpus(self) -> list[str]:
        return list(INSTRUCTIONS)
