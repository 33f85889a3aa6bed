"""Teacher forcing per episode: a share of the episodes follow the oracle instead of the policy.

VALAN mixes both for navigation: some episodes act on the policy and train with RL, the
others execute the oracle's action (which the env puts in the observation) and train with
cross-entropy on it. `TeacherForcingDraws` wraps an actor's env and, at each reset, draws
whether the new episode is teacher-forced, with probability `fraction`, from a generator of
its own (seeded by the first seeded reset, so runs repeat). Every step of the episode
reports the draw as info["teacher_forcing"].

The actor sends that as a per-step extra (`Problem.extra_specs`); the learner executes the
oracle's action for forced steps (`ActionPolicy.select_actor_action`), and the loss trains them
by cross-entropy (`fleetrl.losses.algorithms`). A forced episode's metrics go to the
"teacher" episode group (`episode_group`), so they never count as the policy's.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

TEACHER_FORCING = "teacher_forcing"  # bool, in the step's info and in `UnrollBatch.extras`
# Episode groups: only "train" episodes are the policy's own.
TRAIN, TEACHER = "train", "teacher"


def episode_group(final_info: Any) -> str:
    """The TensorBoard group of an episode's metrics: "train" counts toward the recent-return
    window and --target_mean_return; teacher-forced episodes (which executed the oracle's
    actions) go to "teacher"."""
    return TEACHER if final_info.get(TEACHER_FORCING) else TRAIN


def episode_groups(teacher_forcing_fraction: float) -> tuple[str, ...]:
    """The groups a run's episodes fall in."""
    return (TRAIN, TEACHER) if teacher_forcing_fraction > 0 else (TRAIN,)


class TeacherForcingDraws(gym.Wrapper):
    def __init__(self, env: gym.Env, fraction: float):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"teacher_forcing_fraction must be in [0, 1], got {fraction}")
        super().__init__(env)
        self.fraction = fraction
        self._draws = np.random.default_rng()
        self._forced = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._draws = np.random.default_rng([seed, 0x7EAC4])  # apart from the env's own stream
        self._forced = bool(self._draws.random() < self.fraction)
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, TEACHER_FORCING: self._forced}

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, TEACHER_FORCING: self._forced}
