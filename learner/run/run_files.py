"""The run's two plain files in its logdir: config.json as it starts, summary.json as it ends."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from fleetrl.common.files import atomic_write_json
from fleetrl.learner.config import LearnerConfig
from fleetrl.problems.base import Problem

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunSummary:
    reason: str
    env_steps: int
    episodes: int
    mean_episode_return: float | None  # over the last `return_window` train episodes; None with none
    returns_in_window: int  # the episodes that mean is over (0: no episode yet, and the mean is null)
    return_window: int
    trainer_steps: int
    wall_s: float  # this process's
    target_reached: bool | None
    # The checkpoint written as the run ended; None when it could not be (a full disk, say).
    final_checkpoint: str | None = None
    # The run's, over every process that trained it (resumes included), to its latest checkpoint
    # before this process and then to the end; None where unknown.
    run_wall_s: float | None = None


def write_run_config(config: LearnerConfig, problem: Problem, logdir: str | None = None) -> dict:
    """<logdir>/config.json (or `logdir`'s: a learner rank's own): the whole config as resolved
    (the Problem's defaults included), keeping the "launch" section a launcher wrote there
    before starting this learner."""
    path = os.path.join(logdir or config.logdir, "config.json")
    launch = {}
    if os.path.exists(path):
        with open(path) as f:
            launch = json.load(f).get("launch", {})
    run_config = {
        "learner": dataclasses.asdict(config),
        "problem": {"class": f"{type(problem).__module__}:{type(problem).__qualname__}",
                    "config": dataclasses.asdict(problem.config)},
        **({"launch": launch} if launch else {})}
    atomic_write_json(path, run_config, indent=2)
    return run_config


def rank_logdir(logdir: str, rank: int) -> str:
    """Where a learner rank writes its own files: rank 0 the run's logdir, rank r <logdir>/rank<r>."""
    return logdir if rank == 0 else os.path.join(logdir, f"rank{rank}")


def address_file(logdir: str, rank: int = 0) -> str:
    """Where a learner writes the address it serves: <logdir>/learner_address, rank r's with .rank<r>."""
    return os.path.join(logdir, "learner_address" + (f".rank{rank}" if rank else ""))


def write_summary(logdir: str, summary: RunSummary) -> None:
    """<logdir>/summary.json; a write that fails is logged, since the run itself is over."""
    try:
        atomic_write_json(os.path.join(logdir, "summary.json"), dataclasses.asdict(summary), indent=2)
    except OSError as e:
        log.error("summary.json not written: %s", e)
