"""The learner's TensorBoard summaries: the training scalars, rates and queue levels.

The step axis is env steps. Each write drains the means accumulated since the last one
(losses, episode metrics, latencies) and adds rates over the interval. A write at the
env step of the previous one is skipped (a resumed run's first seconds), so no curve ever
repeats a step; the writer purges what a crashed process wrote after its checkpoint.

Nothing constant is written again and again: counters of rare events only once they are
nonzero, the learning rate only when it changes. The run's config goes to the Text tab.

A write that fails (a full disk, an I/O error) is logged and counted, and its scalars are
lost; the next write opens a new event file (TensorBoard reads them all) and tries again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from fleetrl.learner.accounting.metrics import ScalarMeans
from fleetrl.learner.inference.inference_step import InferenceStep
from fleetrl.learner.policy_version import PolicyVersion

log = logging.getLogger(__name__)

# Counters of rare events (and unrolls left waiting), written once nonzero; settings, written
# when they change.
WHEN_NONZERO = frozenset({"learner/dropped_partial_unrolls", "learner/restarted_envs", "learner/rejected_messages",
                          "learner/resent_steps", "learner/disputed_episodes", "learner/unvouched_episodes",
                          "learner/unroll_queue_size", "learner/failed_checkpoint_writes",
                          "learner/failed_summary_writes", "learner/failed_eval_writes"})
WHEN_CHANGED = frozenset({"optim/learning_rate"})
# Scalars that measure time: the only ones two debug runs of one seed write differently.
WALL_CLOCK = frozenset({"throughput/env_steps_per_s", "throughput/learner_steps_per_s", "learner/trainer_idle_fraction",
                        "inference/latency_ms", "generation/tokens_per_s", "generation/latency_ms"})


@dataclasses.dataclass
class _Counts:
    time: float
    env_steps: int
    policy_version: int
    batches: int
    batch_envs: int


class TrainSummaries:
    def __init__(self, logdir: str, scalars: ScalarMeans, inference: InferenceStep, policy: PolicyVersion,
                 gauges: Callable[[], dict[str, float]], resumed: bool, config: dict[str, Any],
                 env_steps: Callable[[], int] | None = None):
        """`gauges` reads the levels to write as they are (queue size, connected actors, ...);
        `config` is the run's, for TensorBoard's Text tab; `env_steps`, the step axis, the
        fleet's count over every learner rank (default: this learner's)."""
        self._env_steps = env_steps or (lambda: inference.env_steps)
        self._scalars = scalars
        self._inference = inference
        self._policy = policy
        self._gauges = gauges
        self._logdir = logdir
        self.failed_writes = 0
        # purge_step: TensorBoard drops what an earlier process wrote at or after these steps.
        self._writer: SummaryWriter | None = SummaryWriter(logdir, purge_step=self._env_steps() if resumed else None)
        self._last = self._counts()
        self._written = False
        self._last_values: dict[str, float] = {}
        self._writer.add_text("config", "```json\n" + json.dumps(config, indent=2) + "\n```",
                              global_step=self._env_steps())

    def _counts(self) -> _Counts:
        return _Counts(time.monotonic(), self._env_steps(), self._policy.version, self._inference.batches,
                       self._inference.batch_envs)

    def write(self) -> None:
        now, last = self._counts(), self._last
        if now.env_steps == last.env_steps and self._written:
            return  # the step axis is env steps: writing again at the same one would repeat a step
        self._written, self._last = True, now
        elapsed = max(now.time - last.time, 1e-9)
        scalars = self._scalars.drain()
        scalars.update(self._gauges())
        scalars["learner/failed_summary_writes"] = self.failed_writes
        scalars["throughput/env_steps_per_s"] = (now.env_steps - last.env_steps) / elapsed
        scalars["throughput/learner_steps_per_s"] = (now.policy_version - last.policy_version) / elapsed
        if now.batches > last.batches:
            scalars["inference/mean_batch_size"] = (now.batch_envs - last.batch_envs) / (now.batches - last.batches)
        try:
            if self._writer is None:
                self._writer = SummaryWriter(self._logdir)
            for tag, value in scalars.items():
                if not math.isfinite(value) or (tag in WHEN_NONZERO and value == 0) or (
                        tag in WHEN_CHANGED and self._last_values.get(tag) == value):
                    continue
                self._writer.add_scalar(tag, value, global_step=now.env_steps)
                self._last_values[tag] = value
            self._writer.flush()
        except OSError as e:
            self.failed_writes += 1
            log.error("TensorBoard summaries at env step %d not written: %s. Training goes on; the next write "
                      "tries again in a new event file", now.env_steps, e)
            self.close()

    def close(self) -> None:
        """Closes the writer; one that failed is dropped (its event file keeps what reached it)."""
        close_writer(self._writer)
        self._writer = None


def close_writer(writer: SummaryWriter | None) -> None:
    """Closes a TensorBoard writer, logging (not raising) an I/O error: a full disk, say."""
    if writer is not None:
        try:
            writer.close()
        except OSError as e:
            log.error("TensorBoard's event file %s could not be closed: %s", writer.log_dir, e)
