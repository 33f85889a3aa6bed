"""Executes chunks of K actions: one agent step, up to K env steps.

Vision-language-action policies emit K actions at once. `ActionChunks` wraps a
single-action env so that its action is a chunk, [K, ...] of the inner action space, and
plays the actions in order, stopping early when the episode ends. The actor and the
vector env see one ordinary step per chunk:

- reward: the chunk's rewards summed (what `reward_type=chunk_level` trains on);
- terminated / truncated: those of the last executed action;
- info["action_rewards"]: [K] float32, each action's reward, 0 after an early stop;
- info["actions_executed"]: how many of the K actions ran (fewer than K only when the
  episode ended inside the chunk).

The last two travel to the learner as per-step extras (declared by `Problem.extra_specs`,
read by actors from the step's info under these names), so the learner can train with
`reward_type=action_level` and mask the actions that never ran (see fleetrl.losses.chunks).
A reset step carries none: zeros, and 0 actions executed.

Only the chunk's last observation leaves the wrapper. An env whose observations cost much to
make (a rendered camera) can skip the others: if it has an `observation_wanted` attribute,
ActionChunks sets it before each action, False for all but the chunk's last. Such an env
still hands out the observation of a step that ends its episode (fleetrl.envs.libero.env).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

# The names of the per-step extras, in the step's info and in `UnrollBatch.extras`.
ACTION_REWARDS = "action_rewards"  # [K] float32
ACTIONS_EXECUTED = "actions_executed"  # int64
# The hint an env may take: whether the next step's observation will be used.
OBSERVATION_WANTED = "observation_wanted"


def chunk_space(space: gym.Space, chunk_size: int) -> gym.Space:
    """The space of K actions from `space`: MultiDiscrete for Discrete, a stacked Box for Box."""
    if isinstance(space, gym.spaces.Discrete):
        if space.start != 0:
            raise ValueError("action chunks need a Discrete action space that starts at 0")
        return gym.spaces.MultiDiscrete(np.full(chunk_size, space.n, np.int64))
    if isinstance(space, gym.spaces.Box):
        low = np.broadcast_to(space.low, (chunk_size, *space.shape))
        high = np.broadcast_to(space.high, (chunk_size, *space.shape))
        return gym.spaces.Box(low, high, dtype=space.dtype)
    raise ValueError(f"action chunks support Discrete and Box action spaces, not {type(space).__name__}")


class ActionChunks(gym.Wrapper):
    def __init__(self, env: gym.Env, chunk_size: int):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        super().__init__(env)
        self.chunk_size = chunk_size
        self.action_space = chunk_space(env.action_space, chunk_size)

    def step(self, chunk: Any):
        chunk = np.asarray(chunk)
        if chunk.shape[:1] != (self.chunk_size,):
            raise ValueError(f"expected a chunk of {self.chunk_size} actions, got shape {chunk.shape}")
        rewards = np.zeros(self.chunk_size, np.float32)
        hinted = hasattr(self.env.unwrapped, OBSERVATION_WANTED)
        for k in range(self.chunk_size):
            if hinted:
                setattr(self.env.unwrapped, OBSERVATION_WANTED, k == self.chunk_size - 1)
            action = chunk[k].item() if chunk[k].ndim == 0 else chunk[k]
            obs, reward, terminated, truncated, info = self.env.step(action)
            rewards[k] = reward
            if terminated or truncated:
                break
        info = {**info, ACTION_REWARDS: rewards, ACTIONS_EXECUTED: np.int64(k + 1)}
        return obs, float(rewards.sum()), terminated, truncated, info
