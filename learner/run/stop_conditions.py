"""When a run has done what it was asked: a target mean return of its train episodes, a
target of its eval metric, or a budget of env steps."""

from __future__ import annotations

import math

from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.run.run_state import RunState
from fleetrl.learner.training.rank_sync import RankSync


class StopConditions:
    def __init__(self, config: LearnerConfig, fleet: RankSync, run_state: RunState):
        self._target = config.target_mean_return
        self._window = config.return_window
        self._total_env_steps = config.total_env_steps
        self._target_eval, self._metric, self._mode = config.target_eval_metric, config.best_metric, config.best_mode
        self._fleet, self._run_state = fleet, run_state  # the whole fleet's counts, over every learner rank

    @property
    def has_target(self) -> bool:
        return self._target is not None or self._target_eval is not None

    def reason_to_stop(self) -> str | None:
        """Why the run should end now, or None while it goes on."""
        counts = self._fleet.counts()
        if self._target is not None and not math.isnan(counts.mean_return):
            mean = counts.mean_return
            if mean >= self._target:
                return (f"target reached: mean return {mean:.1f} >= {self._target:g} over the last {self._window} "
                        "episodes")
        # The best round so far, which RunState records only once its best.pt is written.
        best = self._run_state.best
        if self._target_eval is not None and best is not None and (
                best >= self._target_eval if self._mode == "max" else best <= self._target_eval):
            return (f"target reached: eval {self._metric} {best:.4g} {'>=' if self._mode == 'max' else '<='} "
                    f"{self._target_eval:g}")
        if self._total_env_steps and counts.env_steps >= self._total_env_steps:
            return f"total_env_steps reached ({self._total_env_steps:,})"
        return None
