"""Helpers for tests that talk to a real learner over real gRPC."""

from __future__ import annotations

import contextlib
import queue
import threading

import grpc
import numpy as np

from fleetrl import PROTOCOL_VERSION
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.tensors import encode


@contextlib.contextmanager
def running_learner(tmp_path, **overrides):
    config = LearnerConfig(bind="127.0.0.1:0", logdir=str(tmp_path / "logs"), summary_interval_s=0.5, **overrides)
    learner = Learner(config)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        yield learner
    finally:
        learner.finish("test over")
        thread.join(timeout=30)
        assert not thread.is_alive(), "the learner did not stop"


class RawActor:
    """Speaks the protocol message by message, so tests can send anything."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.LearnerStub(self.channel)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = self.stub.Stream(iter(self._requests.get, None))

    def send(self, message: pb.ActorMessage) -> pb.LearnerMessage:
        self._requests.put(message)
        return next(self._responses)

    def close(self):
        self._requests.put(None)
        self._responses.cancel()
        self.channel.close()


def handshake(actor_id="a", num_envs=2, problem="cartpole", obs_shape=(4,), obs_dtype=np.float32, action_shape=()):
    return pb.ActorMessage(handshake=pb.Handshake(
        protocol_version=PROTOCOL_VERSION, problem=problem, actor_id=actor_id, num_envs=num_envs,
        observation_spec=[pb.TensorSpec(name="observation", dtype=pb.FLOAT32 if obs_dtype == np.float32 else pb.FLOAT64,
                                        shape=list(obs_shape))],
        action_spec=[pb.TensorSpec(name="action", dtype=pb.INT64, shape=list(action_shape))],
    ))


def cartpole_step(num_envs=2, run_ids=None, obs=None, rewards=None, env_indices=None):
    env_indices = list(range(num_envs)) if env_indices is None else env_indices
    n = len(env_indices)
    obs = np.zeros((n, 4), np.float32) if obs is None else obs
    return pb.ActorMessage(step=pb.Step(
        env_indices=env_indices, run_ids=run_ids or [i + 1 for i in range(n)],
        observations=[obs if isinstance(obs, pb.Tensor) else encode("observation", obs)],
        rewards=[1.0] * n if rewards is None else rewards, terminated=[False] * n, truncated=[False] * n,
    ))
