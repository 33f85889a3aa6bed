"""PointReach: move a point to the coloured target that the instruction names.

A fast continuous task with images, language and action chunks, for learning a
vision-language-action policy on a CPU (the flow-matching VLA's test bed). The arena is
[-1, 1]^2 with `num_targets` discs of distinct colours; the instruction says which one to
reach ("go to the red target"). An action is a velocity in [-1, 1]^2, scaled by
`step_size`. Touching the named target ends the episode with reward 1 (info "success"),
touching another ends it with 0; `max_episode_steps` truncates.

Observation:
- "image": [S, S, 3] uint8, top-down (targets, and the point in white);
- "state": [2] float32, the point's position;
- "language": [text_bytes] uint8, the instruction's UTF-8 bytes, zero-padded;
- "oracle_action": [oracle_chunk, 2] float32 when `oracle_chunk` > 0: the scripted
  expert's next actions (straight at its goal), for teacher forcing and warm starts.

The expert heads for the named target, or, in a share `1 - expert_accuracy` of episodes
(drawn at reset), for another one: a noisy demonstrator, like the gym_cards solvers'
`solver_accuracy`. With `expert_heading_error` (degrees) it steers off its goal by an angle
drawn at reset, uniform in +-that: it curves in (each step aims again, turned by the same
angle) and takes longer, so a tight `max_episode_steps` makes it fail in some episodes.

`layout="random"` places the targets anywhere (at least 0.55 apart); `"slots"` puts them
at fixed places on a circle and draws only their colours and the start, an easier task for
a small model to learn from pixels. Registered as `fleetrl/PointReach-v0`. It steps in
numpy (the background is drawn once per episode); `bench/flow_vla.py` prints its steps/s.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 240), "yellow": (240, 220, 40),
           "magenta": (220, 50, 220), "cyan": (40, 220, 230)}
LAYOUTS = ("random", "slots")
TARGET_RADIUS = 0.15
POINT_RADIUS = 0.07


class PointReachEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, image_size: int = 32, num_targets: int = 3, step_size: float = 0.15,
                 max_episode_steps: int = 30, oracle_chunk: int = 0, expert_accuracy: float = 1.0,
                 text_bytes: int = 32, layout: str = "random", expert_heading_error: float = 0.0,
                 render_mode: str | None = None):
        if not 1 <= num_targets <= len(COLOURS):
            raise ValueError(f"num_targets must be in [1, {len(COLOURS)}], got {num_targets}")
        if not 0.0 <= expert_accuracy <= 1.0:
            raise ValueError(f"expert_accuracy must be in [0, 1], got {expert_accuracy}")
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; choose from {LAYOUTS}")
        if image_size < 8:
            raise ValueError(f"image_size must be at least 8, got {image_size}")
        self.image_size, self.num_targets, self.step_size = image_size, num_targets, step_size
        self.max_episode_steps, self.oracle_chunk = max_episode_steps, oracle_chunk
        self.expert_accuracy, self.text_bytes, self.render_mode = expert_accuracy, text_bytes, render_mode
        self.layout = layout
        if not 0.0 <= expert_heading_error < 90.0:
            raise ValueError(f"expert_heading_error must be in [0, 90) degrees, got {expert_heading_error}")
        self.expert_heading_error = expert_heading_error
        self._expert_turn = np.eye(2)
        spaces = {"image": gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8),
                  "state": gym.spaces.Box(-1, 1, (2,), np.float32),
                  "language": gym.spaces.Box(0, 255, (text_bytes,), np.uint8)}
        if oracle_chunk > 0:
            spaces["oracle_action"] = gym.spaces.Box(-1, 1, (oracle_chunk, 2), np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        # Pixel centres in arena coordinates, y up.
        centres = (np.arange(image_size) + 0.5) / image_size * 2 - 1
        self._px, self._py = np.meshgrid(centres, -centres)
        self._targets = np.zeros((num_targets, 2))
        self._colours: list[str] = []
        self._goal = self._expert_goal = 0
        self._position = np.zeros(2)
        self._steps = 0
        self._background = np.zeros((image_size, image_size, 3), np.uint8)
        self._language = np.zeros(text_bytes, np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        self._colours = list(rng.choice(list(COLOURS), self.num_targets, replace=False))
        self._targets, self._position = self._layout(rng)
        self._goal = int(rng.integers(self.num_targets))
        self._expert_goal = self._goal
        if self.num_targets > 1 and rng.random() >= self.expert_accuracy:
            self._expert_goal = int((self._goal + rng.integers(1, self.num_targets)) % self.num_targets)
        angle = np.radians(rng.uniform(-self.expert_heading_error, self.expert_heading_error))
        self._expert_turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        self._steps = 0
        self._background = self._draw_background()
        text = f"go to the {self._colours[self._goal]} target".encode()[: self.text_bytes]
        self._language = np.zeros(self.text_bytes, np.uint8)
        self._language[: len(text)] = np.frombuffer(text, np.uint8)
        return self._observation(), {"goal": self._goal}

    def step(self, action):
        action = np.clip(np.asarray(action, np.float64).reshape(2), -1, 1)
        self._position = np.clip(self._position + self.step_size * action, -1, 1)
        self._steps += 1
        touched = np.flatnonzero(np.linalg.norm(self._targets - self._position, axis=1) < TARGET_RADIUS)
        terminated = touched.size > 0
        success = terminated and int(touched[0]) == self._goal
        truncated = not terminated and self._steps >= self.max_episode_steps
        info: dict[str, Any] = {"goal": self._goal}
        if terminated or truncated:
            info["success"] = float(success)
        return self._observation(), float(success), bool(terminated), bool(truncated), info

    def render(self):
        return self._image()

    # ----- the scripted expert -----

    def expert_actions(self, count: int) -> np.ndarray:
        """[count, 2]: the expert's next actions from here, in a straight line at its goal, at
        full speed (a unit vector) until the last step, which lands on it."""
        position, goal = self._position.copy(), self._targets[self._expert_goal]
        actions = np.zeros((count, 2), np.float32)
        for i in range(count):
            move = self._expert_turn @ ((goal - position) / self.step_size)
            move /= max(1.0, float(np.linalg.norm(move)))
            actions[i] = move
            position = np.clip(position + self.step_size * move, -1, 1)
        return actions

    # ----- drawing -----

    def _layout(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Targets at least 0.55 apart and a start at least 0.45 from each, such that the
        straight line from the start to any target passes clear of the others (so the
        expert, which goes straight, always reaches the target it heads for)."""
        clearance = TARGET_RADIUS + POINT_RADIUS
        if self.layout == "slots":  # fixed places on a circle; the colours are drawn, so the instruction decides
            angles = 2 * np.pi * (np.arange(self.num_targets) / self.num_targets + 0.25)
            slots = 0.65 * np.stack([np.cos(angles), np.sin(angles)], axis=1)
        while True:
            points = rng.uniform(-0.8, 0.8, (self.num_targets + 1, 2))
            if self.layout == "slots":
                points[:-1] = slots
            targets, start = points[:-1], points[-1]
            gaps = np.linalg.norm(targets[:, None] - targets[None], axis=-1) + np.eye(self.num_targets)
            if (gaps < 0.55).any() or (np.linalg.norm(targets - start, axis=1) < 0.45).any():
                continue
            if all(_distance_to_segment(targets[j], start, targets[i]) >= clearance
                   for i in range(self.num_targets) for j in range(self.num_targets) if i != j):
                return targets, start

    def _disc(self, centre: np.ndarray, radius: float) -> np.ndarray:
        return (self._px - centre[0]) ** 2 + (self._py - centre[1]) ** 2 < radius**2

    def _draw_background(self) -> np.ndarray:
        image = np.zeros((self.image_size, self.image_size, 3), np.uint8)
        for centre, colour in zip(self._targets, self._colours):
            image[self._disc(centre, TARGET_RADIUS)] = COLOURS[colour]
        return image

    def _image(self) -> np.ndarray:
        image = self._background.copy()
        image[self._disc(self._position, POINT_RADIUS)] = 255
        return image

    def _observation(self) -> dict[str, np.ndarray]:
        obs = {"image": self._image(), "state": self._position.astype(np.float32), "language": self._language.copy()}
        if self.oracle_chunk > 0:
            obs["oracle_action"] = self.expert_actions(self.oracle_chunk)
        return obs


def _distance_to_segment(point: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    along = np.clip(np.dot(point - a, ab) / np.dot(ab, ab), 0, 1)
    return float(np.linalg.norm(point - (a + along * ab)))


gym.register("fleetrl/PointReach-v0", entry_point=PointReachEnv)
