"""An env's observations and actions, held to the spaces its Problem declares.

Actors batch their envs' observations into arrays shaped by the observation space, so an
env that returns a (3,) state for a (1,) space fails inside gymnasium ("Output array is
the wrong shape"), naming no key, no shapes and no env. `SpaceCheck` wraps the env a
Problem makes and checks every observation a reset returns, the first one included,
against the env's own space: each key present, its shape the space's, its dtype one the
space's can take without a change of kind (float64 into float32 is fine, a float image
into uint8 is not). Bounds are not checked: a state a little outside its box is common
and harmless. A mismatch raises `EnvSpaceError`, one line naming the Problem, the env's
class, the key, and the expected and received shape and dtype.

Only resets are checked: once an episode, so the check costs nothing per step
(`bench/space_check.py` measures it). A step's observation is checked only where the vector
env fails to batch it (`step_observation_error`): the same error, naming the env, the key and
both shapes, in place of numpy's "Output array is the wrong shape". An action the env rejects (its `step` raises) is
re-raised as an `EnvSpaceError` that names the action's shape and dtype beside the space,
when the action is not in it; an env's own error on an action of its space is left as it is
(its traceback, and a debugger's post mortem, stay in the env).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class EnvSpaceError(ValueError):
    """An env's observation or action does not fit the space its Problem declares."""


class SpaceCheck(gym.Wrapper):
    def __init__(self, env: gym.Env, problem: str):
        super().__init__(env)
        self._problem = problem

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        mismatch = observation_mismatch(self.env.observation_space, obs)
        if mismatch:
            raise EnvSpaceError(f"problem {self._problem}: {type(self.env.unwrapped).__name__}.reset returned an "
                                f"observation that does not fit its observation_space: {mismatch}")
        return obs, info

    def step(self, action):
        try:
            return self.env.step(action)
        except EnvSpaceError:
            raise
        except Exception as e:
            if self.env.action_space.contains(action):  # the env's own error: its traceback, untouched
                raise
            array = np.asarray(action) if not isinstance(action, dict) else None
            got = (f"shape {array.shape}, dtype {array.dtype}" if array is not None
                   else f"keys {sorted(action)}")
            raise EnvSpaceError(f"problem {self._problem}: {type(self.env.unwrapped).__name__}.step rejected the "
                                f"action ({got}), which is not in its action_space {self.env.action_space}: "
                                f"{type(e).__name__}: {e}") from e


def step_observation_error(space: gym.Space, observations: list[Any], env_names: list[str]) -> EnvSpaceError | None:
    """Why a step's observations (one per env) could not be batched, as the error a reset
    gets; None when each fits `space` (the failure was something else)."""
    for index, (obs, name) in enumerate(zip(observations, env_names)):
        mismatch = observation_mismatch(space, obs)
        if mismatch:
            return EnvSpaceError(f"env {index} ({name}): its step returned an observation that does not fit its "
                                 f"observation_space: {mismatch}")
    return None


def observation_mismatch(space: gym.Space, obs: Any, key: str = "observation") -> str | None:
    """What in `obs` does not fit `space` (by keys, shapes and dtype kinds), or None."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, dict):
            return f"{key} is a {type(obs).__name__}, the space a Dict of keys {sorted(space.spaces)}"
        missing = [k for k in space.spaces if k not in obs]
        if missing:
            return f"{key} lacks keys {missing} (it has {sorted(obs)})"
        for name, subspace in space.spaces.items():
            mismatch = observation_mismatch(subspace, obs[name], f"{key}[{name!r}]")
            if mismatch:
                return mismatch
        return None
    if isinstance(space, gym.spaces.Box):
        array = np.asarray(obs)
        if array.shape != space.shape or not np.can_cast(array.dtype, space.dtype, "same_kind"):
            return (f"{key} has shape {array.shape} and dtype {array.dtype}; the space says shape {space.shape} and "
                    f"dtype {space.dtype}")
        return None
    return None if space.contains(obs) else f"{key} {obs!r} is not in {space}"
