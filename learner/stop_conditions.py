"""When a run has done what it was asked: a target mean return, or a budget of env steps."""

from __future__ import annotations

from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.inference import InferenceStep
from fleetrl.learner.metrics import EpisodeWindow


class StopConditions:
    def __init__(self, config: LearnerConfig, episodes: EpisodeWindow, inference: InferenceStep):
        self._target = config.target_mean_return
        self._window = config.return_window
        self._total_env_steps = config.total_env_steps
        self._episodes, self._inference = episodes, inference

    def reason_to_stop(self) -> str | None:
        """Why the run should end now, or None while it goes on."""
        if self._target is not None and len(self._episodes) >= self._window:
            mean = self._episodes.mean("return")
            if mean >= self._target:
                return (f"target reached: mean return {mean:.1f} >= {self._target:g} over the last {self._window} "
                        "episodes")
        if self._total_env_steps and self._inference.env_steps >= self._total_env_steps:
            return f"total_env_steps reached ({self._total_env_steps:,})"
        return None
