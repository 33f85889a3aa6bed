"""Plays chosen episodes of the eval set on a fixed set of envs, one episode per env at a time.

Unlike training, evaluation plays exactly the episodes it is given, each from its own
reset (`Problem.eval_reset`), so it steps only the envs that still have an episode: a
`Pending` step holds those envs' latest observations, and `advance` applies the actions
chosen for them. An env whose latest observation ended its episode goes idle, and its
episode's metrics travel with that observation, as in training.

Eval actors send each `Pending` step to the learner; `fleetrl.launch.evaluate` feeds it
straight to `EvalInference`. Both see the same episodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.actor.extras import env_extras
from fleetrl.problems.base import Problem
from fleetrl.problems.eval_records import eval_records

# (env index, episode, one env's observation, whether the episode just ended)
FrameHook = Callable[[int, int, Mapping[str, np.ndarray], bool, gym.Env], None]


@dataclasses.dataclass
class FinishedEpisode:
    env_index: int
    episode: int
    metrics: dict[str, float]
    # The Problem's record of the episode (Problem.episode_record), for standalone evaluation.
    record: dict[str, Any] | None = None
    images: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # Problem.eval_images


@dataclasses.dataclass
class Pending:
    """The latest step of the envs that are playing; arrays are [n, ...] in `env_indices` order."""

    env_indices: np.ndarray
    observation: dict[str, np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    finished: list[FinishedEpisode]
    extras: dict[str, np.ndarray]  # the Problem's per-step extras


class EvalEpisodes:
    def __init__(self, problem: Problem, num_envs: int, on_frame: FrameHook | None = None):
        self.problem = problem
        self.records = eval_records(problem)
        self.envs = [problem.make_eval_env() for _ in range(num_envs)]
        self._extra_specs = problem.extra_specs()
        self._on_frame = on_frame
        self._queue: list[int] = []
        self._episode = [-1] * num_envs  # -1: idle
        self._last: list[dict[str, Any] | None] = [None] * num_envs
        self._finished: list[FinishedEpisode] = []

    def close(self) -> None:
        for env in self.envs:
            env.close()

    @property
    def playing(self) -> bool:
        return any(e >= 0 for e in self._episode) or bool(self._queue)

    def abandon(self) -> None:
        """Drops every queued and running episode (the learner gives them to others on a reconnect)."""
        self._queue.clear()
        self._episode = [-1] * len(self.envs)
        self._finished = []

    def start(self, episodes: Sequence[int]) -> None:
        """Queues `episodes`; each idle env starts the next one."""
        self._queue.extend(int(e) for e in episodes)
        for i in range(len(self.envs)):
            if self._episode[i] < 0 and self._queue:
                self._reset(i, self._queue.pop(0))

    def pending(self) -> Pending:
        active = [i for i, e in enumerate(self._episode) if e >= 0]
        last = [self._last[i] for i in active]
        step = Pending(
            env_indices=np.array(active, np.int64),
            observation={k: np.stack([s["obs"][k] for s in last]) for k in (last[0]["obs"] if last else {})},
            reward=np.array([s["reward"] for s in last], np.float32),
            terminated=np.array([s["terminated"] for s in last], bool),
            truncated=np.array([s["truncated"] for s in last], bool),
            finished=self._finished,
            extras={spec.name: np.array([s["extras"][spec.name] for s in last], spec.dtype).reshape(-1, *spec.shape)
                    for spec in self._extra_specs},
        )
        self._finished = []
        return step

    def advance(self, step: Pending, actions: Mapping[str, np.ndarray]) -> None:
        """Applies the actions chosen for `step`'s envs."""
        for row, i in enumerate(step.env_indices.tolist()):
            if step.terminated[row] or step.truncated[row]:
                self._episode[i] = -1  # its final observation was shown; the action is moot
                if self._queue:
                    self._reset(i, self._queue.pop(0))
                continue
            action = {k: v[row] for k, v in actions.items()}
            env_action = action["action"] if list(action) == ["action"] else action
            obs, reward, terminated, truncated, info = self.envs[i].step(env_action)
            state = self._last[i]
            state["return"] += float(reward)
            state["length"] += 1
            self._observe(i, obs, float(reward), bool(terminated), bool(truncated), info)
            if terminated or truncated:
                metrics = {"return": state["return"], "length": float(state["length"])}
                metrics.update(self.problem.episode_metrics(info))
                self._finished.append(FinishedEpisode(i, self._episode[i], metrics, self.records.episode_record(info),
                                                      self.records.eval_images(info)))

    def _reset(self, i: int, episode: int) -> None:
        seed, options = self.problem.eval_reset(episode)
        obs, info = self.envs[i].reset(seed=seed, options=options)
        self._episode[i] = episode
        self._last[i] = {"return": 0.0, "length": 0}
        self._observe(i, obs, 0.0, False, False, info)

    def _observe(self, i: int, obs: Any, reward: float, terminated: bool, truncated: bool, info: Mapping) -> None:
        observation = obs if isinstance(obs, dict) else {"observation": obs}
        self._last[i].update(obs={k: np.asarray(v) for k, v in observation.items()}, reward=reward,
                             terminated=terminated, truncated=truncated,
                             extras=env_extras(info, self._extra_specs))
        if self._on_frame is not None:
            self._on_frame(i, self._episode[i], self._last[i]["obs"], terminated or truncated, self.envs[i])
