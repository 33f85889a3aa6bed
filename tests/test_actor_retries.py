"""An actor retries a learner that is not there (tests/test_errors.py), never one whose code failed."""

from concurrent import futures

import grpc
import pytest

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.config import ActorConfig
from fleetrl.proto import learner_pb2_grpc as pb_grpc


class BrokenLearner(pb_grpc.LearnerServicer):
    """A real gRPC server whose GetRunInfo raises, as a learner-side bug would: gRPC answers UNKNOWN."""

    def __init__(self):
        self.calls = 0

    def GetRunInfo(self, request, context):
        self.calls += 1
        raise KeyError("a bug in the learner")


@pytest.fixture
def broken_learner():
    servicer = BrokenLearner()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_LearnerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_a_learner_side_error_is_reported_at_once_not_retried(broken_learner):
    servicer, address = broken_learner
    actor = Actor(ActorConfig(learner_address=address, num_envs=1, max_reconnect_s=600))
    with pytest.raises(ActorError, match="failed while serving actor .*see its log.*UNKNOWN.*a bug in the learner"):
        actor.run(max_steps=1)
    assert servicer.calls == 1
