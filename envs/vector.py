"""Batches of Gymnasium envs stepped together, with next-step autoreset.

With next-step autoreset, the step that ends an episode returns its final observation
(so the learner can bootstrap a truncated episode from its value), and the following
step resets that env and returns the new episode's first observation with reward 0. The
learner's loss masks that reset transition (see `fleetrl.losses.transitions`).

Actors always use next-step autoreset, because the learner must see each episode's final
observation as an ordinary step. `autoreset_mode="same_step"` is there for loops of one's
own (RLinf's style): the finished env resets inside the step, and its final observation
and info come back in `info["final_obs"]` / `info["final_info"]`, masked by
`info["_final_obs"]` (exactly the envs that finished). "disabled" leaves resets to the caller.

With `group_size` > 1 (GRPO), consecutive envs form groups whose members draw the same
sequence of reset seeds, so the k-th episodes of a group's members start from the same state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from fleetrl.envs.restarting_vector import RestartingVectorEnv
from fleetrl.envs.space_check import step_observation_error


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


AUTORESET_MODES = {"next_step": gym.vector.AutoresetMode.NEXT_STEP,
                   "same_step": gym.vector.AutoresetMode.SAME_STEP,
                   "disabled": gym.vector.AutoresetMode.DISABLED}


def make_vector_env(make_env: Callable[[], gym.Env], num_envs: int, asynchronous: bool = False,
                    group_size: int = 1, seed: int = 0, autoreset_mode: str = "next_step",
                    first_env: int = 0) -> gym.vector.VectorEnv:
    """`asynchronous` runs each env in its own (spawned) process: worth it for heavy simulators
    only. With next-step autoreset that is a `RestartingVectorEnv`, which starts a dead env's
    process again.
    `first_env`: these are envs [first_env, first_env + num_envs) of an actor's larger set (one
    of its env groups), and GRPO groups get the reset seeds they would get in the whole set."""
    if autoreset_mode not in AUTORESET_MODES:
        raise ValueError(f"unknown autoreset_mode {autoreset_mode!r}; choose from {sorted(AUTORESET_MODES)}")
    if group_size > 1:
        if num_envs % group_size:
            raise ValueError(f"num_envs {num_envs} is not a multiple of group_size {group_size}")
        if first_env % group_size:
            raise ValueError(f"first_env {first_env} is not a multiple of group_size {group_size}")
        group_seeds = np.random.SeedSequence([seed, 1]).generate_state((first_env + num_envs) // group_size)
        group_seeds = group_seeds[first_env // group_size:]
        fns = [functools.partial(_grouped, make_env, int(group_seeds[i // group_size])) for i in range(num_envs)]
    else:
        fns = [make_env] * num_envs
    mode = AUTORESET_MODES[autoreset_mode]
    if asynchronous and mode == gym.vector.AutoresetMode.NEXT_STEP:
        return RestartingVectorEnv(fns, seed)  # the actor's: a dead env process is started again
    if asynchronous:
        # spawn, not fork: the actor already holds a gRPC channel and torch threads, which
        # a forked child must not inherit.
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context="spawn")
    return SpaceCheckedSyncVectorEnv(fns, autoreset_mode=mode)


class SpaceCheckedSyncVectorEnv(gym.vector.SyncVectorEnv):
    """gymnasium's SyncVectorEnv, whose failure to batch a step's observations names the
    env, the key and both shapes (numpy's own error names none of them)."""

    def step(self, actions):
        try:
            return super().step(actions)
        except ValueError as e:
            error = step_observation_error(self.single_observation_space, self._env_obs,
                                           [type(env.unwrapped).__name__ for env in self.envs])
            if error is None:  # the observations fit: the env's own error
                raise
            raise error from e
