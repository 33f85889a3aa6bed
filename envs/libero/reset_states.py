"""Every (task, init state) pair of a LIBERO suite as one global `reset_state_id`.

Task t owns the ids in [bins[t], bins[t + 1]), where `bins` are the cumulative init-state
counts, so the mapping works both ways and suites with uneven counts stay contiguous (the
pattern RLinf uses). `ResetSchedule` hands ids to envs: `group_size` consecutive envs share
one id (GRPO compares like with like), drawn at random or in order.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np


class ResetStates:
    def __init__(self, init_states_per_task: list[int]):
        if not init_states_per_task or min(init_states_per_task) < 1:
            raise ValueError(f"every task needs at least one init state, got {init_states_per_task}")
        self.counts = list(init_states_per_task)
        self.bins = [0, *itertools.accumulate(self.counts)]

    def __len__(self) -> int:
        return self.bins[-1]

    @property
    def num_tasks(self) -> int:
        return len(self.counts)

    def task_trial(self, reset_state_id: int) -> tuple[int, int]:
        """(task index, init state index within the task)."""
        if not 0 <= reset_state_id < len(self):
            raise ValueError(f"reset_state_id {reset_state_id} is outside [0, {len(self)})")
        task = bisect.bisect_right(self.bins, reset_state_id) - 1
        return task, reset_state_id - self.bins[task]

    def reset_state_id(self, task: int, trial: int) -> int:
        if not 0 <= task < self.num_tasks or not 0 <= trial < self.counts[task]:
            raise ValueError(f"no init state {trial} of task {task} (tasks: {self.num_tasks}, "
                             f"init states: {self.counts[task] if 0 <= task < self.num_tasks else '-'})")
        return self.bins[task] + trial


class ResetSchedule:
    """Which reset_state_id each of `num_envs` envs plays next; groups of `group_size` share one."""

    def __init__(self, states: ResetStates, num_envs: int, group_size: int = 1, ordered: bool = False,
                 seed: int = 0):
        if group_size < 1 or num_envs % group_size:
            raise ValueError(f"num_envs ({num_envs}) must be a multiple of group_size ({group_size})")
        self.states, self.num_envs, self.group_size, self.ordered = states, num_envs, group_size, ordered
        self._rng = np.random.default_rng(seed)
        self._next = 0

    def next_ids(self) -> np.ndarray:
        """[num_envs] ids for the next episode of every env."""
        groups = self.num_envs // self.group_size
        if self.ordered:
            ids = (self._next + np.arange(groups)) % len(self.states)
            self._next = int((self._next + groups) % len(self.states))
        else:
            ids = self._rng.integers(len(self.states), size=groups)
        return np.repeat(ids, self.group_size)
