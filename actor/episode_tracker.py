"""Per-env episode return and length, under next-step autoreset.

The step after an episode's end is the reset of the next one (reward 0, not a
transition), so it counts toward neither episode. Each finished episode is reported with
the Problem's own metrics and its episode group (`fleetrl.envs.teacher_forcing.episode_group`), both from the
info of its last step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fleetrl.envs.teacher_forcing import episode_group
from fleetrl.problems.base import Problem
from fleetrl.proto import learner_pb2 as pb


class EpisodeTracker:
    def __init__(self, num_envs: int, problem: Problem | None = None):
        self._returns = np.zeros(num_envs, np.float64)
        self._lengths = np.zeros(num_envs, np.int64)
        # The first update is of the first transition: the reset's observation went out
        # in a step of its own that no update saw (the learner takes that one as the reset).
        self._resetting = np.zeros(num_envs, bool)
        self._problem = problem

    def begin(self, envs: list[int]) -> None:
        """These envs' last observation came from a reset outside the episode flow (an env
        process started again): what they played so far is dropped."""
        self._returns[envs] = 0.0
        self._lengths[envs] = 0
        self._resetting[envs] = True

    def update(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
               info: Mapping[str, Any]) -> list[pb.EpisodeStats]:
        """Accounts for one vector step; returns the stats of the episodes it ended."""
        counting = ~self._resetting
        self._returns += np.where(counting, rewards, 0.0)
        self._lengths += counting
        ended = (terminated | truncated) & counting
        finished = []
        for i in np.flatnonzero(ended):
            metrics = {"return": float(self._returns[i]), "length": float(self._lengths[i])}
            group = ""
            if self._problem is not None:
                final_info = env_info(info, int(i))
                metrics.update(self._problem.episode_metrics(final_info))
                group = episode_group(final_info)
            finished.append(pb.EpisodeStats(env_index=int(i), metrics=metrics, group=group))
        self._returns[ended] = 0.0
        self._lengths[ended] = 0
        self._resetting = ended
        return finished


def env_info(info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One env's entries of a Gymnasium vector info dict (which masks keys with '_key')."""
    out = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        out[key] = env_info(value, index) if isinstance(value, dict) else value[index]
    return out
