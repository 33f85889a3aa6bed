"""Per-env episode return and length, under next-step autoreset.

The step after an episode's end is the reset of the next one (reward 0, not a
transition), so it counts toward neither episode.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from fleetrl.proto import learner_pb2 as pb


class EpisodeTracker:
    def __init__(self, num_envs: int, extra_metrics: Callable[[Mapping[str, Any]], dict[str, float]] | None = None):
        self._returns = np.zeros(num_envs, np.float64)
        self._lengths = np.zeros(num_envs, np.int64)
        self._resetting = np.ones(num_envs, bool)  # the first observation comes from reset
        self._extra_metrics = extra_metrics

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
            if self._extra_metrics is not None:
                metrics.update(self._extra_metrics(env_info(info, int(i))))
            finished.append(pb.EpisodeStats(env_index=int(i), metrics=metrics))
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
