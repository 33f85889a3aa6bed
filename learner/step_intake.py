"""What the learner takes in of one actor step, whoever delivers it: a gRPC stream
(`server.LearnerService`) or the one-thread debug run (`fleetrl.launch.debug_run`).

A train step is decoded and checked (`wire_messages`), its finished episodes go to their
group's summaries and the train ones to the recent-return window (once: a resent step
brings none, see `StepLedger`), and what is left is the request for inference. An eval
step's finished episodes go to their eval round, and its request carries the round's
frozen agent. Nothing here waits on the transport, so both drivers share every line of it.
"""

from __future__ import annotations

import numpy as np

from fleetrl.learner.eval_inference import EvalRequest
from fleetrl.learner.inference import StepRequest
from fleetrl.learner.served_run import ServedRun, episode_tag
from fleetrl.learner.wire_messages import Episode, WireDecoder
from fleetrl.problems.base import TRAIN
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.tensors import WireError


class StepIntake:
    def __init__(self, run: ServedRun):
        self.run = run
        self.decoder = WireDecoder(run)

    def train_request(self, step: pb.Step, slots: np.ndarray, num_envs: int) -> StepRequest:
        """The inference request of a train step; raises WireError naming what is wrong."""
        request, episodes = self.decoder.decode_step(step, slots, num_envs)
        if self.run.step_ledger.take(int(request.run_ids[0]), step.sequence):  # not a resent one
            self._count(episodes)
        return request

    def decode_eval(self, step: pb.Step, slots: np.ndarray, num_envs: int) -> tuple[StepRequest, list[Episode]]:
        return self.decoder.decode_step(step, slots, num_envs)

    def eval_request(self, actor_id: str, request: StepRequest, episodes: list[Episode]) -> EvalRequest:
        """The inference request of an eval step, once its finished episodes are in their
        round (the round's last one writes its results: a disk write)."""
        for episode in episodes:
            if episode.eval_episode is None:
                raise WireError(f"finished_episodes: env {episode.env} of an eval actor gives no eval_episode")
            try:
                result = self.run.eval_rounds.record(actor_id, episode.eval_episode, episode.metrics, episode.images,
                                                     episode.record)
            except ValueError as e:
                raise WireError(f"finished_episodes: {e}") from None
            if result is not None and self.run.eval_results is not None:
                self.run.eval_results(result)
        snapshot = self.run.eval_rounds.agent_for(actor_id)
        if snapshot is None:
            raise WireError("an eval step before any eval work: call GetEvalWork first")
        return EvalRequest(request, snapshot[0])

    def _count(self, episodes: list[Episode]) -> None:
        """Training episodes go to their group's summaries (see `episode_tag`); the "train"
        ones also to the recent-return window."""
        for episode in episodes:
            for name, value in episode.metrics.items():
                if name == "return":
                    self.run.scalars.add_with_spread(episode_tag(episode.group, name), value)
                else:
                    self.run.scalars.add(episode_tag(episode.group, name), value)
        self.run.episodes.extend(e.metrics for e in episodes if e.group == TRAIN)
