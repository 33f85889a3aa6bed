"""Every (task, init state) pair of a LIBERO suite as one global `reset_state_id`.

Task t owns the ids in [bins[t], bins[t + 1]), where `bins` are the cumulative init-state
counts, so the mapping works both ways and suites with uneven counts stay contiguous (the
pattern RLinf uses). Training draws ids at random (`LiberoEnv.reset`, from its seed, so the
members of a GRPO group, which reset with the same seeds, share each id:
`fleetrl.envs.vector.GroupResetSeeds`); evaluation walks them in order
(`LiberoProblem.eval_reset`).
"""

from __future__ import annotations

import bisect
import itertools


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
