"""The learner's TensorBoard summaries: the training scalars, rates and queue levels.

The step axis is env steps. Each write drains the means accumulated since the last one
(losses, episode metrics, latencies) and adds rates over the interval. A write at the
env step of the previous one is skipped (a resumed run's first seconds), so no curve ever
repeats a step; the writer purges what a crashed process wrote after its checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

from torch.utils.tensorboard import SummaryWriter

from fleetrl.learner.inference import InferenceStep, PolicyVersion
from fleetrl.learner.metrics import ScalarMeans


@dataclasses.dataclass
class _Counts:
    time: float
    env_steps: int
    policy_version: int
    batches: int
    batch_envs: int


class TrainSummaries:
    def __init__(self, logdir: str, scalars: ScalarMeans, inference: InferenceStep, policy: PolicyVersion,
                 gauges: Callable[[], dict[str, float]], resumed: bool):
        """`gauges` reads the levels to write as they are (queue size, connected actors, ...)."""
        self._scalars = scalars
        self._inference = inference
        self._policy = policy
        self._gauges = gauges
        # purge_step: TensorBoard drops what an earlier process wrote at or after these steps.
        self._writer = SummaryWriter(logdir, purge_step=inference.env_steps if resumed else None)
        self._last = self._counts()
        self._written = False

    def _counts(self) -> _Counts:
        return _Counts(time.monotonic(), self._inference.env_steps, self._policy.version, self._inference.batches,
                       self._inference.batch_envs)

    def write(self) -> None:
        now, last = self._counts(), self._last
        if now.env_steps == last.env_steps and self._written:
            return  # the step axis is env steps: writing again at the same one would repeat a step
        self._written, self._last = True, now
        elapsed = max(now.time - last.time, 1e-9)
        scalars = self._scalars.drain()
        scalars.update(self._gauges())
        scalars["throughput/env_steps_per_s"] = (now.env_steps - last.env_steps) / elapsed
        scalars["throughput/learner_steps_per_s"] = (now.policy_version - last.policy_version) / elapsed
        if now.batches > last.batches:
            scalars["inference/mean_batch_size"] = (now.batch_envs - last.batch_envs) / (now.batches - last.batches)
        for tag, value in scalars.items():
            if math.isfinite(value):
                self._writer.add_scalar(tag, value, global_step=now.env_steps)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
