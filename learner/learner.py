"""The Learner: a `TrainingRun` served to actors over gRPC, trained on its own thread.

Threads:
- the server's event loop (`serving.LearnerServer`): every actor stream (`server.LearnerService`)
  and the inference batchers (`inference_batcher.InferenceBatcher`);
- the inference thread, which runs the batched forward pass (`inference.InferenceStep`) and
  hands finished unrolls to the algorithm's unroll hook and then the unroll queue;
- a second one for eval actors (`eval_inference.EvalInference`), whose rounds
  (`eval_rounds.EvalRounds`) end in `eval_results.EvalResults`;
- the monitor (`monitor.Monitor`), which writes TensorBoard summaries (`summaries`) and checks the
  stop conditions (`stop_conditions`);
- the caller's thread, which runs the training loop below and writes checkpoints (`run_state`)
  and the run's config.json and summary.json (`run_files`).

The parts (and the data path through them) are the `training_run.TrainingRun`'s; this
class adds the transport and the threads. `fleetrl.launch.debug_run` drives the same
parts from one thread instead.

A learner started on a logdir that holds checkpoints resumes from the latest: weights,
optimizer, counters and RNG states. Its TensorBoard writers purge what the previous
process wrote after that checkpoint, so no curve steps back or repeats a step.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.run.monitor import Monitor
from fleetrl.learner.run.run_files import RunSummary, write_summary
from fleetrl.learner.run.training_run import TrainingRun
from fleetrl.learner.transport.server import LearnerService
from fleetrl.learner.transport.serving import LearnerServer
from fleetrl.problems.base import Problem


class Learner(TrainingRun):
    def __init__(self, config: LearnerConfig, problem: Problem | None = None):
        super().__init__(config, problem)
        self.service = LearnerService(self.served, config.max_actors)
        self.server = LearnerServer(config, self.service)
        self.address = self.server.address
        self.authenticated = self.server.authenticated

    def run(self) -> RunSummary:
        summaries = self.open()
        self.server.start()  # and the batchers
        monitor = Monitor(self.stop, self.stop_conditions, self.finish, summaries, self.config.summary_interval_s,
                          self._started)
        monitor.start()
        stopped_together = False  # every rank left the loop at the same batch: they can meet once more
        try:
            while True:
                # Unrolls waiting when the trainer comes back for more (at batch_size or above, the
                # trainer is the bottleneck).
                self.scalars.add("learner/unroll_queue_size", self.unrolls.qsize())
                started = time.monotonic()
                # With learner ranks, any rank's stop ends every rank at this same batch.
                if not self.train_step(self.unrolls.get_batch(self.config.batch_size), started):
                    stopped_together = True
                    break
        except BaseException as e:
            self.finish(f"error: {e!r}")
            raise
        finally:
            self.finish("stopped")
            self.server.stop(grace=5).wait()  # the batchers first: waiting steps end their streams
            if stopped_together:  # the fleet's final counts, once every rank has served its last step
                self.fleet.exchange(stopping=True)
            monitor.join(timeout=10)
            final_checkpoint = self.close(summaries, stopped_together, failed=sys.exc_info()[0] is not None)
        summary = dataclasses.replace(self.summary(), final_checkpoint=final_checkpoint)
        write_summary(self.own_logdir, summary)
        return summary

    def gauges(self) -> dict[str, float]:
        return {**super().gauges(), "learner/rejected_messages": self.service.rejected_messages}
