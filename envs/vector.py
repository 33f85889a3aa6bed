"""Batches of Gymnasium envs stepped together, with next-step autoreset.

With next-step autoreset, the step that ends an episode returns its final observation
(so the learner can bootstrap a truncated episode from its value), and the following
step resets that env and returns the new episode's first observation with reward 0. The
learner's loss masks that reset transition (see `fleetrl.losses.transitions`).
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym


def make_vector_env(make_env: Callable[[], gym.Env], num_envs: int, asynchronous: bool = False) -> gym.vector.VectorEnv:
    """`asynchronous` runs each env in its own process: worth it for heavy simulators only."""
    fns = [make_env] * num_envs
    mode = gym.vector.AutoresetMode.NEXT_STEP
    if asynchronous:
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
