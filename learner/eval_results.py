"""Where complete eval rounds go: eval/ summaries, eval.jsonl, and best.pt.

Each round's means are written under <logdir>/eval at the round's policy version, the
TensorBoard step of eval curves (eval/return, eval/length and the Problem's metrics). One
JSON line per round goes to <logdir>/eval.jsonl, and a round whose `best_metric` beats
every earlier one has its weights saved as best.pt. Rounds overlapping with stragglers may
finish out of order: TensorBoard's step axis only moves forward, so a late round is kept in
eval.jsonl but not written to TensorBoard.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from torch.utils.tensorboard import SummaryWriter

from fleetrl.learner.eval_rounds import EvalResult
from fleetrl.learner.run_state import RunState

log = logging.getLogger(__name__)


class EvalResults:
    def __init__(self, logdir: str, best_metric: str, run_state: RunState):
        self._logdir = logdir
        self._best_metric = best_metric
        self._run_state = run_state
        self._lock = threading.Lock()
        self._writer: SummaryWriter | None = None
        self._purge_step: int | None = None
        self._closed = False
        self._last_step = -1

    def open(self, resumed: bool) -> None:
        """Called as the run starts; the eval/ writer itself waits for the first round, so a
        run without eval actors has no (empty) eval run in TensorBoard."""
        # purge_step: TensorBoard drops what an earlier process wrote at or after this version.
        self._purge_step = self._run_state.policy.version if resumed else None

    def _writer_for_rounds(self) -> SummaryWriter:
        if self._writer is None:
            self._writer = SummaryWriter(os.path.join(self._logdir, "eval"), purge_step=self._purge_step)
        return self._writer

    def close(self) -> None:
        with self._lock:
            self._closed = True  # a straggling round still reaches eval.jsonl
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def __call__(self, result: EvalResult) -> None:
        record = {"round": result.round, "policy_version": result.policy_version, "episodes": result.episodes,
                  "trainer_steps": self._run_state.policy.version, "env_steps": self._run_state.env_steps,
                  **result.metrics}
        with self._lock:
            if result.policy_version > self._last_step and not self._closed:
                self._last_step = result.policy_version
                writer = self._writer_for_rounds()
                for name, mean in result.metrics.items():
                    writer.add_scalar(f"eval/{name}", mean, global_step=result.policy_version)
                for tag, image in result.images.items():
                    writer.add_image(f"eval/{tag}", image, global_step=result.policy_version, dataformats="HWC")
                writer.flush()
            with open(os.path.join(self._logdir, "eval.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
            better = self._run_state.offer_best(result.metrics.get(self._best_metric), result.agent.state_dict(),
                                                result.policy_version, result.metrics)
        log.info("eval round %d at policy version %d: %s%s", result.round, result.policy_version,
                 ", ".join(f"{k} {v:.3g}" for k, v in sorted(result.metrics.items())), " (best)" if better else "")
