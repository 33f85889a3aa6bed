"""What the learner takes in of one actor step, whoever delivers it: a gRPC stream
(`server.LearnerService`) or the one-thread debug run (`fleetrl.launch.debug_run`).

A train step is decoded and checked (`wire_messages`, `metric_rules`), the learner's own
account of its envs' episodes moves on (`episode_accounts`), and the episodes the learner
vouches for go to their group's summaries and the train ones to the recent-return window
(once: a resent step brings none, see `StepLedger`); what is left is the request for
inference. An actor whose reports the learner disputes is logged at most once a minute, and
keeps its stream: a buggy env is its user's to see, not a reason to stop training.

An eval step's finished episodes go to their eval round, and its request carries the
round's frozen agent. Nothing here waits on the transport, so both drivers share every line
of it.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from fleetrl.envs.teacher_forcing import TRAIN
from fleetrl.learner.accounting.episode_accounts import vouch
from fleetrl.learner.evaluation.eval_inference import EvalRequest
from fleetrl.learner.inference.inference_step import StepRequest
from fleetrl.learner.transport.served_run import ServedRun, episode_tag
from fleetrl.learner.transport.wire_messages import Episode, WireDecoder
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.tensors import WireError

log = logging.getLogger(__name__)

DISPUTE_LOG_INTERVAL_S = 60.0


class StepIntake:
    def __init__(self, run: ServedRun):
        self.run = run
        self.decoder = WireDecoder(run)
        self._logged: dict[str, float] = {}  # actor -> when its disputes were last logged

    def train_request(self, step: pb.Step, slots: np.ndarray, num_envs: int, actor: str = "") -> StepRequest:
        """The inference request of a train step; raises WireError naming what is wrong."""
        request, episodes = self.decoder.decode_step(step, slots, num_envs)
        if self.run.train.step_ledger.take(int(request.run_ids[0]), step.sequence):  # not a resent one
            accounts = self.run.train.accounts
            ended = accounts.step(request.slots, request.run_ids, request.reward,
                                  request.terminated | request.truncated)
            if len(ended.rows) or episodes:
                verdict = vouch(ended, episodes, step.env_indices)
                accounts.disputed += len(verdict.disputes)
                accounts.unvouched += verdict.unvouched
                if verdict.disputes:
                    self._log_disputes(actor, verdict.disputes)
                self._count(verdict.counted)
        return request

    def release(self, slots: np.ndarray) -> None:
        """A train stream ended: its envs' episode accounts wait for a reconnect."""
        self.run.train.accounts.release(slots)

    def decode_eval(self, step: pb.Step, slots: np.ndarray, num_envs: int) -> tuple[StepRequest, list[Episode]]:
        return self.decoder.decode_step(step, slots, num_envs, evaluating=True)

    def eval_request(self, actor_id: str, request: StepRequest, episodes: list[Episode]) -> EvalRequest:
        """The inference request of an eval step, once its finished episodes are in their
        round (the round's last one writes its results: a disk write)."""
        for episode in episodes:
            if episode.eval_episode is None:
                raise WireError(f"finished_episodes: env {episode.env} of an eval actor gives no eval_episode")
            try:
                result = self.run.evaluation.rounds.record(actor_id, episode.eval_episode, episode.metrics,
                                                           episode.images, episode.record)
            except ValueError as e:
                raise WireError(f"finished_episodes: {e}") from None
            if result is not None and self.run.evaluation.results is not None:
                self.run.evaluation.results(result)
        snapshot = self.run.evaluation.rounds.agent_for(actor_id)
        if snapshot is None:
            raise WireError("an eval step before any eval work: call GetEvalWork first")
        return EvalRequest(request, snapshot[0])

    def _count(self, episodes: list[tuple[str, dict[str, float]]]) -> None:
        """Training episodes, (group, metrics), go to their group's summaries (see
        `episode_tag`); the "train" ones also to the recent-return window."""
        for group, metrics in episodes:
            for name, value in metrics.items():
                if name == "return":
                    self.run.train.scalars.add_with_spread(episode_tag(group, name), value)
                else:
                    self.run.train.scalars.add(episode_tag(group, name), value)
        self.run.train.episodes.extend(metrics for group, metrics in episodes if group == TRAIN)

    def _log_disputes(self, actor: str, disputes: list[str]) -> None:
        now = time.monotonic()
        if now - self._logged.get(actor, -DISPUTE_LOG_INTERVAL_S) < DISPUTE_LOG_INTERVAL_S:
            return
        if len(self._logged) > 4096:  # actors long gone
            self._logged = {a: t for a, t in self._logged.items() if now - t < DISPUTE_LOG_INTERVAL_S}
        self._logged[actor] = now
        log.warning("actor %r reports episodes that differ from the steps the learner took in; the learner counts "
                    "its own figures (learner/disputed_episodes in TensorBoard, %d so far; at most one line a minute "
                    "per actor): %s", actor, self.run.train.accounts.disputed, "; ".join(disputes[:3]))
