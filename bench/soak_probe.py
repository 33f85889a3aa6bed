"""The soak run's probe of exactly-once counting across a learner restart.

The probe is a pretend actor with one env. While the soak's actors are paused, it sends a
new numbered step that carries one finished episode, and the learner's count must grow by
exactly one. After the learner is killed and restarted, the probe sends that step again,
as an actor does whose answer was lost with the learner. The new learner must answer it
and count it again only if the checkpoint it resumed from had not counted it (the soak
knows which from the checkpoint's episode count).
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
        """A new step with one finished episode, of return `episode_return`."""
        self._sequence += 1
        step = step_message(np.zeros((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, bool),
                            np.zeros(1, bool), self._run_ids,
                            [pb.EpisodeStats(env_index=0, metrics={"return": episode_return})], {})
        step.sequence = self._sequence
        self.held = pb.ActorMessage(step=step)
        self._send(self.held)

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
