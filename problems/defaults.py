"""Settings a Problem chooses for the runs that train it, when the run leaves them unset.

    class MyProblem(Problem):
        learner_defaults = LearnerDefaults(batch_size=32, block_inference_on_training=True)
        launch_defaults = LaunchDefaults(envs_per_actor=1)

Each field is None ("no opinion: the built-in default") or the Problem's value. They are
applied where the configs are built (`LearnerConfig`, the launchers' configs), so a run
started from Python resolves exactly as one started from the command line; a setting
given explicitly always wins.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LearnerDefaults:
    """`LearnerConfig` settings (see its fields for what each one does)."""

    unroll_length: int | None = None
    batch_size: int | None = None
    block_inference_on_training: bool | None = None
    inference_batch_size: int | None = None
    unroll_queue_size: int | None = None
    eval_interval_s: float | None = None
    best_metric: str | None = None
    best_mode: str | None = None


@dataclasses.dataclass(frozen=True)
class LaunchDefaults:
    """The fleet a launcher starts (`launch.local`, `launch.ray`): a heavy simulator wants
    fewer envs than CartPole's 2 actors x 32."""

    num_actors: int | None = None
    envs_per_actor: int | None = None
    eval_envs_per_actor: int | None = None
