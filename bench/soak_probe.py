"""The soak run's probe of exactly-once counting across a learner restart.

The probe is a pretend actor with one env. While the soak's actors are paused, it sends
the reset of a one-step episode and then the step that ends it, with its report, and the
learner's count must grow by exactly one. After the learner is killed and restarted, the
probe sends that last step again, as an actor does whose answer was lost with the learner.
The new learner must answer it and take its report in again only if the checkpoint it
resumed from had not counted it (the soak knows which from the checkpoint's episode count).
It takes the report in as unvouched (it never saw that episode begin), so the soak counts
what a learner took in: its episodes plus its unvouched ones.
"""

from __future__ import annotations

import queue

import grpc
import numpy as np

from fleetrl.actor.actor import handshake_message
from fleetrl.actor.env_groups import step_message
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.run_ids import new_run_ids


class ResendProbe:
    def __init__(self, address: str, problem: str = "cartpole"):
        self._address = address
        self._problem_name, self._problem = problem, load_problem(problem)
        self._run_ids = new_run_ids(1)
        self._sequence = 0
        self._streams = 0
        self.held: pb.ActorMessage | None = None  # the last step sent: what a restart makes the probe resend

    def send_new(self, episode_return: float) -> None:
        """Two new steps: the reset of an episode, then its one step, of reward
        `episode_return`, which ends it and carries its report. The learner counts an episode
        only where its own account of the env's steps ends one (`learner.episode_accounts`)."""
        self._send(self._step(0.0, done=False))
        self.held = self._step(episode_return, done=True)
        self._send(self.held)

    def _step(self, reward: float, done: bool) -> pb.ActorMessage:
        self._sequence += 1
        # The report names no length: after a restart the learner's account of this env
        # begins at the resent step, so its length would differ from the probe's own.
        episodes = [pb.EpisodeStats(env_index=0, metrics={"return": reward})] if done else []
        step = step_message(np.zeros((1, 4), np.float32), np.full(1, reward, np.float32), np.full(1, done),
                            np.zeros(1, bool), self._run_ids, episodes, {})
        step.sequence = self._sequence
        return pb.ActorMessage(step=step)

    def resend(self) -> None:
        self._send(self.held)

    def _send(self, message: pb.ActorMessage) -> None:
        """On a stream of its own (a new actor id each time, so no old stream is in the way),
        a handshake and `message`, each answered."""
        self._streams += 1
        handshake = handshake_message(self._problem_name, self._problem, f"soak-probe-{self._streams}", 1)
        requests: queue.SimpleQueue = queue.SimpleQueue()
        with grpc.insecure_channel(self._address) as channel:
            responses = pb_grpc.LearnerStub(channel).Stream(iter(requests.get, None), timeout=30)
            try:
                for item in (pb.ActorMessage(handshake=handshake), message):
                    requests.put(item)
                    next(responses)
            finally:
                requests.put(None)
                responses.cancel()
