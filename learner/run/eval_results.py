"""Where complete eval rounds go: eval/ summaries, eval.jsonl, and best.pt.

Each round's means are written under <logdir>/eval at the round's policy version, the
TensorBoard step of eval curves (eval/return, eval/length and the Problem's metrics). One
JSON line per round goes to <logdir>/eval.jsonl, and a round whose `best_metric` beats
every earlier one has its weights saved as best.pt. Rounds overlapping with stragglers may
finish out of order: TensorBoard's step axis only moves forward, so a late round is kept in
eval.jsonl but not written to TensorBoard.

A Problem that asks for it (`Problem.learner_writes_eval_records`) also gets each round's
episode records written with its `write_eval_records`, under <logdir>/eval_records with the
round's policy version in the file names: R2R's results_{split}_{policy_version}.json.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from fleetrl.common.files import strict_json
from fleetrl.learner.evaluation.eval_rounds import EvalResult
from fleetrl.learner.run.run_state import RunState
from fleetrl.learner.run.summaries import close_writer

log = logging.getLogger(__name__)

# Problem.write_eval_records: (records, output folder, file-name suffix) -> paths written.
RecordWriter = Callable[[list[dict[str, Any]], str, str], list[str]]


class EvalResults:
    def __init__(self, logdir: str, best_metric: str, run_state: RunState, write_records: RecordWriter | None = None):
        self._logdir = logdir
        self._write_records = write_records
        self._best_metric = best_metric
        self._run_state = run_state
        self._lock = threading.Lock()
        self._writer: SummaryWriter | None = None
        self._purge_step: int | None = None
        self._closed = False
        self._last_step = -1
        self.failed_writes = 0

    def open(self, resumed: bool) -> None:
        """Called as the run starts; the eval/ writer itself waits for the first round, so a
        run without eval actors has no (empty) eval run in TensorBoard."""
        # purge_step: TensorBoard drops what an earlier process wrote at or after this version.
        self._purge_step = self._run_state.policy.version if resumed else None

    def _writer_for_rounds(self) -> SummaryWriter:
        if self._writer is None:
            self._writer = SummaryWriter(os.path.join(self._logdir, "eval"), purge_step=self._purge_step)
            self._purge_step = None  # a writer reopened after a failed write must not purge this run's rounds
        return self._writer

    def close(self) -> None:
        with self._lock:
            self._closed = True  # a straggling round still reaches eval.jsonl
            self._drop_writer()

    def _drop_writer(self) -> None:
        """Closes the eval writer; after a failed write the next round opens a new event file."""
        close_writer(self._writer)
        self._writer = None

    def __call__(self, result: EvalResult) -> None:
        record = {"round": result.round, "policy_version": result.policy_version, "episodes": result.episodes,
                  "trainer_steps": self._run_state.policy.version, "env_steps": self._run_state.env_steps,
                  **result.metrics}
        with self._lock:
            try:
                if result.policy_version > self._last_step and not self._closed:
                    self._last_step = result.policy_version
                    writer = self._writer_for_rounds()
                    for name, mean in result.metrics.items():
                        writer.add_scalar(f"eval/{name}", mean, global_step=result.policy_version)
                    for tag, image in result.images.items():
                        writer.add_image(f"eval/{tag}", image, global_step=result.policy_version, dataformats="HWC")
                    writer.flush()
                with open(os.path.join(self._logdir, "eval.jsonl"), "a") as f:
                    f.write(strict_json(record) + "\n")
            except OSError as e:  # a full disk: the round is lost to the files, not to best.pt or the run
                self.failed_writes += 1
                log.error("eval round %d not written to TensorBoard or eval.jsonl: %s. Training goes on; the next "
                          "round tries again", result.round, e)
                self._drop_writer()
            better = self._run_state.offer_best(result.metrics.get(self._best_metric), result.agent.state_dict(),
                                                result.policy_version, result.metrics)
        log.info("eval round %d at policy version %d: %s%s", result.round, result.policy_version,
                 ", ".join(f"{k} {v:.3g}" for k, v in sorted(result.metrics.items())), " (best)" if better else "")
        if self._write_records is not None and result.records:
            self._write_round_records(result)

    def _write_round_records(self, result: EvalResult) -> None:
        output = os.path.join(self._logdir, "eval_records")
        try:
            paths = self._write_records(result.records, output, f"_{result.policy_version}")
        except Exception:  # the Problem's own writer: its failure must not end the stream that finished the round
            log.exception("eval round %d: the Problem's write_eval_records failed; the round's metrics stand",
                          result.round)
            return
        log.info("eval round %d: %d episode records written to %s", result.round, len(result.records),
                 ", ".join(paths) or output)
