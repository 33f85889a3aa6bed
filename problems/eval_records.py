"""Optional: what a Problem reports of its eval episodes beyond their metrics.

A Problem whose eval episodes feed outside scorers (R2R's leaderboard files) or
TensorBoard pictures inherits `EvalRecords` and overrides what it needs; the learner,
the actors and `launch.evaluate` take the hooks through `eval_records(problem)`, which
also adopts these methods from a Problem that defines them without inheriting the class.
The others need none of this.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import numpy as np

HOOKS = ("eval_metric_names", "eval_images", "episode_record", "write_eval_records", "learner_writes_eval_records",
         "check_episode_record")


class EvalRecords:
    """The eval-record hooks and their defaults: nothing beyond the episode's metrics."""

    def eval_metric_names(self) -> tuple[str, ...]:
        """Names that only eval episodes report, besides `episode_metric_names` (an eval
        split's own, say)."""
        return ()

    def eval_images(self, final_info: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Pictures of an eval episode ({tag: [H, W, 3] uint8}) that eval actors send with its
        metrics, for TensorBoard's eval/ images. Keep it to a few episodes per round."""
        return {}

    def episode_record(self, final_info: Mapping[str, Any]) -> dict[str, Any] | None:
        """What `launch.evaluate` keeps of an eval episode for `write_eval_records` (say, its
        trajectory); None keeps nothing. Stays on the machine that plays it."""
        return None

    def write_eval_records(self, records: list[dict[str, Any]], output: str, suffix: str = "") -> list[str]:
        """Writes the eval episodes' records (in episode order) under `output`, in whatever
        format outside tools expect, with `suffix` at the end of each file's stem (the
        learner passes "_{policy_version}"); returns the files written."""
        return []

    def learner_writes_eval_records(self) -> bool:
        """Whether eval actors send each eval episode's record to the learner, which then
        writes every complete eval round with `write_eval_records` under <logdir>/eval_records.
        Records travel as bounded JSON (proto/episode_records.py), so keep them small."""
        return False

    def check_episode_record(self, record: Mapping[str, Any]) -> None:
        """Raises ValueError, naming the field, for a record that `episode_record` could not
        have made. The learner calls it on every record that comes over the wire, before
        `write_eval_records` sees it."""


def eval_records(problem: Any) -> EvalRecords:
    """The Problem's eval-record hooks: its own where it defines them, the defaults elsewhere."""
    if isinstance(problem, EvalRecords):
        return problem
    defaults = EvalRecords()
    return types.SimpleNamespace(**{name: getattr(problem, name, None) or getattr(defaults, name) for name in HOOKS})
