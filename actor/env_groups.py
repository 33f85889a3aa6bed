"""An actor's envs in groups that take turns (double buffering, as in Sample Factory).

With one group, the actor sends a step of all its envs and waits idle for the actions.
With two, group A's step is on its way to the learner while group B steps its envs, so
stepping overlaps the round trip and the learner's inference. Each group sends its own
Step, naming its envs by their actor-wide indices: the learner keys every env by index,
so it needs no notion of groups. It answers a stream's steps in the order they came.

Group g holds envs [start, start + size) and resets them from the same seeds they would
get in one group, so a grouped actor plays exactly the episodes an ungrouped one plays
for the same actions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.actor.episode_tracker import EpisodeTracker
from fleetrl.actor.extras import vector_extras
from fleetrl.problems.base import Problem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.run_ids import new_run_ids
from fleetrl.proto.tensors import encode_all

log = logging.getLogger(__name__)


def group_bounds(num_envs: int, num_groups: int, group_size: int = 1) -> list[tuple[int, int]]:
    """[start, stop) of each group: as equal as whole GRPO groups (`group_size` envs that
    share reset seeds) allow. Raises ValueError when the envs cannot be split so."""
    if num_groups < 1:
        raise ValueError(f"env_groups is {num_groups}; it must be at least 1")
    units = num_envs // group_size
    if units < num_groups:
        what = f"{num_envs} envs" if group_size == 1 else f"{units} groups of {group_size} envs (GRPO's group_size)"
        raise ValueError(f"env_groups is {num_groups}, but the actor has only {what} to split; "
                         "use fewer env groups or more envs")
    bounds, start = [], 0
    for g in range(num_groups):
        size = (units // num_groups + (g < units % num_groups)) * group_size
        bounds.append((start, start + size))
        start += size
    return bounds


class EnvGroup:
    """A slice of the actor's envs with its own vector env, episode tracker and next Step."""

    def __init__(self, problem: Problem, envs: gym.vector.VectorEnv, start: int, run_ids: np.ndarray,
                 first_reset_seeds: np.ndarray):
        self.envs = envs
        self.start = start
        self.size = envs.num_envs
        self.run_ids = run_ids
        self._extra_specs = problem.extra_specs()
        self._tracker = EpisodeTracker(self.size, problem)
        self.env_restarts = 0
        self._sequence = 0  # numbers this group's steps, so the learner counts a resent one's episodes once
        obs, info = envs.reset(seed=[int(s) for s in first_reset_seeds])
        zeros = np.zeros(self.size, bool)
        self.step = self._message(obs, np.zeros(self.size, np.float32), zeros, zeros, [], info)

    def act(self, env_actions: Any) -> None:
        """Steps the envs with the learner's actions and makes the next Step to send."""
        obs, reward, terminated, truncated, info = self.envs.step(env_actions)
        restarted = getattr(self.envs, "restarted", ())  # a RestartingVectorEnv's dead env, begun again
        if restarted:
            log.warning("envs %s restarted after their process died: their episodes are lost, and new run ids "
                        "make the learner drop their partial unrolls", [self.start + i for i in restarted])
            self.run_ids = self.run_ids.copy()
            self.run_ids[list(restarted)] = new_run_ids(len(restarted))
            self._tracker.begin(list(restarted))
            self.env_restarts += len(restarted)
        episodes = self._tracker.update(reward, terminated, truncated, info)
        for episode in episodes:
            episode.env_index += self.start
        self.step = self._message(obs, reward, terminated, truncated, episodes, info)

    def _message(self, obs, reward, terminated, truncated, episodes: list[pb.EpisodeStats],
                 info: Mapping[str, Any]) -> pb.Step:
        self._sequence += 1
        step = step_message(obs, reward, terminated, truncated, self.run_ids, episodes,
                            vector_extras(info, self._extra_specs, self.size),
                            range(self.start, self.start + self.size))
        step.sequence = self._sequence
        return step


def env_actions(actions: Mapping[str, np.ndarray], action_specs) -> Any:
    """What a vector env steps with: the one action's array, or a dict of several."""
    return actions[action_specs[0].name] if len(action_specs) == 1 else dict(actions)


def make_env_groups(problem: Problem, make_vector_env: Callable[..., gym.vector.VectorEnv], num_envs: int,
                    num_groups: int, run_ids: np.ndarray, seed: int) -> list[EnvGroup]:
    """`make_vector_env(size, first_env)` builds the envs [first_env, first_env + size)."""
    first_reset_seeds = np.random.SeedSequence(seed).generate_state(num_envs)
    groups = []
    try:
        for start, stop in group_bounds(num_envs, num_groups, problem.config.group_size):
            groups.append(EnvGroup(problem, make_vector_env(stop - start, start), start, run_ids[start:stop],
                                   first_reset_seeds[start:stop]))
    except BaseException:
        for group in groups:
            group.envs.close()
        raise
    return groups


def step_message(obs, reward, terminated, truncated, run_ids: np.ndarray, episodes: list[pb.EpisodeStats],
                 extras: dict[str, np.ndarray], env_indices=None) -> pb.Step:
    """A Step of the envs `env_indices` (default: 0 to n-1)."""
    n = len(run_ids)
    observations = obs if isinstance(obs, dict) else {"observation": obs}
    return pb.Step(
        env_indices=range(n) if env_indices is None else env_indices, run_ids=run_ids.tolist(),
        observations=encode_all(observations), rewards=np.asarray(reward, np.float32).tolist(),
        terminated=np.asarray(terminated, bool).tolist(), truncated=np.asarray(truncated, bool).tolist(),
        finished_episodes=episodes, extras=encode_all(extras),
    )
