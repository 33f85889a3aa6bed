"""Batches of Gymnasium envs stepped together, with next-step autoreset.

With next-step autoreset, the step that ends an episode returns its final observation
(so the learner can bootstrap a truncated episode from its value), and the following
step resets that env and returns the new episode's first observation with reward 0. The
learner's loss masks that reset transition (see `fleetrl.losses.transitions`).

With `group_size` > 1 (GRPO), consecutive envs form groups whose members draw the same
sequence of reset seeds, so the k-th episodes of a group's members start from the same state.
"""

from __future__ import annotations

import functools
from typing import Callable

import gymnasium as gym
import numpy as np


class GroupResetSeeds(gym.Wrapper):
    """Resets from its own seed sequence, ignoring the seed it is given: members of a group
    built with the same `seed` reset identically, episode after episode."""

    def __init__(self, env: gym.Env, seed: int):
        super().__init__(env)
        self._seeds = np.random.default_rng(seed)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return self.env.reset(seed=int(self._seeds.integers(2**31)), options=options)


def _grouped(make_env: Callable[[], gym.Env], seed: int) -> gym.Env:
    return GroupResetSeeds(make_env(), seed)


def make_vector_env(make_env: Callable[[], gym.Env], num_envs: int, asynchronous: bool = False,
                    group_size: int = 1, seed: int = 0) -> gym.vector.VectorEnv:
    """`asynchronous` runs each env in its own process: worth it for heavy simulators only."""
    if group_size > 1:
        if num_envs % group_size:
            raise ValueError(f"num_envs {num_envs} is not a multiple of group_size {group_size}")
        group_seeds = np.random.SeedSequence([seed, 1]).generate_state(num_envs // group_size)
        fns = [functools.partial(_grouped, make_env, int(group_seeds[i // group_size])) for i in range(num_envs)]
    else:
        fns = [make_env] * num_envs
    mode = gym.vector.AutoresetMode.NEXT_STEP
    if asynchronous:
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
