"""Fuzz: over a thousand malformed messages over real gRPC, while a good actor keeps training."""

import queue
import threading

import grpc
import numpy as np

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.tensors import encode

LIMIT_MB = 1
NUM_ENVS = 2


def with_step(mutate):
    """A handshake, then a valid CartPole step that `mutate(step, rng)` spoils."""
    def make(wire, rng):
        message = wire.cartpole_step(NUM_ENVS, obs=rng.normal(size=(NUM_ENVS, 4)).astype(np.float32))
        mutate(message.step, rng)
        return [wire.handshake(actor_id=f"fuzz-{rng.integers(1 << 62)}", num_envs=NUM_ENVS), message]
    return make


def set_observation(step, array):
    del step.observations[:]
    step.observations.append(encode("observation", array))


def truncate(step, rng):
    data = step.observations[0].data
    step.observations[0].data = data[:int(rng.integers(0, len(data)))]


def bad_reward(step, rng):
    step.rewards[int(rng.integers(NUM_ENVS))] = rng.choice([np.nan, np.inf, -np.inf])


def oversize(step, rng):
    # Over the service's limit, under the transport's (4x): the service names the problem.
    step.observations[0].data = bytes(int(rng.integers(LIMIT_MB << 20, 3 * LIMIT_MB << 20)))


def garbage_after_handshake(wire, rng):
    return [wire.handshake(actor_id=f"fuzz-{rng.integers(1 << 62)}"), rng.bytes(int(rng.integers(1, 200)))]


def non_finite_observation(step, rng):
    array = rng.normal(size=(NUM_ENVS, 4)).astype(np.float32)
    array[int(rng.integers(NUM_ENVS)), int(rng.integers(4))] = rng.choice([np.nan, np.inf, -np.inf])
    set_observation(step, array)


CASES = {
    "wrong dtype": with_step(lambda s, rng: set_observation(s, rng.normal(size=(NUM_ENVS, 4)))),
    "wrong shape": with_step(lambda s, rng: set_observation(
        s, np.zeros((NUM_ENVS, int(rng.choice([1, 2, 3, 5, 8]))), np.float32))),
    "wrong batch": with_step(lambda s, rng: set_observation(s, np.zeros((NUM_ENVS + 1, 4), np.float32))),
    "truncated bytes": with_step(truncate),
    "non-finite reward": with_step(bad_reward),
    "unknown env index": with_step(lambda s, rng: s.env_indices.__setitem__(
        int(rng.integers(NUM_ENVS)), int(rng.integers(NUM_ENVS, 1 << 31)))),
    "repeated env index": with_step(lambda s, rng: s.env_indices.__setitem__(1, s.env_indices[0])),
    "missing rewards": with_step(lambda s, rng: s.rewards.pop()),
    "run id 0": with_step(lambda s, rng: s.run_ids.__setitem__(0, 0)),
    "unknown dtype": with_step(lambda s, rng: setattr(s.observations[0], "dtype", int(rng.integers(10, 1000)))),
    "extra tensor": with_step(lambda s, rng: s.observations.append(encode("extra", np.zeros((NUM_ENVS, 1))))),
    "undeclared extra": with_step(lambda s, rng: s.extras.append(encode("action_rewards", np.zeros((NUM_ENVS, 3))))),
    "non-finite observation": with_step(non_finite_observation),
    "non-finite episode metric": with_step(lambda s, rng: (s.terminated.__setitem__(0, True),
                                                           s.finished_episodes.append(pb.EpisodeStats(
                                                               env_index=0, metrics={"return": float("nan")})))),
    "episode on an env that is not done": with_step(lambda s, rng: s.finished_episodes.append(
        pb.EpisodeStats(env_index=0, metrics={"return": 1.0}))),
    "oversize message": with_step(oversize),
    "step before handshake": lambda wire, rng: [wire.cartpole_step(NUM_ENVS)],
    "repeated handshake": lambda wire, rng: [wire.handshake(actor_id=f"fuzz-{rng.integers(1 << 62)}")] * 2,
    "empty message": lambda wire, rng: [pb.ActorMessage()],
    "empty message after the handshake": lambda wire, rng: [wire.handshake(actor_id=f"fuzz-{rng.integers(1 << 62)}"),
                                                            pb.ActorMessage()],
    "unparsable first message": lambda wire, rng: [b"\xff" * 11 + rng.bytes(int(rng.integers(0, 50)))],
    "garbage after the handshake": garbage_after_handshake,
}


def send(channel, messages) -> tuple[grpc.StatusCode, str]:
    """Sends each message (serialized here, so raw bytes go too) on a new stream, reading a reply to each."""
    call = channel.stream_stream("/fleetrl.Learner/Stream", request_serializer=lambda b: b,
                                 response_deserializer=pb.LearnerMessage.FromString)
    requests = queue.SimpleQueue()
    responses = call(iter(requests.get, None))
    try:
        for message in messages:
            requests.put(message if isinstance(message, bytes) else message.SerializeToString())
            next(responses)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()
    finally:
        requests.put(None)
        responses.cancel()


def test_a_thousand_malformed_messages_are_each_rejected_while_a_good_actor_trains(tmp_path, running_learner, wire,
                                                                                   eventually):
    rng = np.random.default_rng(0)
    with running_learner(tmp_path, max_message_mb=LIMIT_MB, batch_size=4, unroll_length=10) as learner:
        good = Actor(ActorConfig(learner_address=learner.address, num_envs=8, actor_id="good"))
        errors = []
        thread = threading.Thread(target=lambda: _run(good, errors))
        thread.start()
        try:
            while learner.policy.version < 3:
                assert thread.is_alive(), errors
                threading.Event().wait(0.05)
            steps_before = learner.policy.version
            names = sorted(CASES)
            channel = grpc.insecure_channel(learner.address, options=[
                ("grpc.max_send_message_length", 8 << 20)])
            seen = {}
            for i in range(1100):
                name = names[i % len(names)] if i < len(names) else names[int(rng.integers(len(names)))]
                code, details = send(channel, CASES[name](wire, rng))
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (name, code, details)
                seen[name] = details
            channel.close()
            assert learner.service.rejected_messages == 1100
            assert "over the limit of 1,048,576" in seen["oversize message"]
            assert "not a valid ActorMessage" in seen["unparsable first message"]
            assert "an empty ActorMessage" in seen["empty message"]
            assert "an empty ActorMessage" in seen["empty message after the handshake"]
            assert "'observation': env" in seen["non-finite observation"] and "NaN or infinite" in seen[
                "non-finite observation"]
            assert "finite" in seen["non-finite episode metric"]
            assert "neither terminated nor truncated" in seen["episode on an env that is not done"]
            # The good actor was served all along, and the trainer kept going. Every refused
            # stream has left the learner's records by the time its status arrived (server.py),
            # but the count is read from this thread, so it is waited on rather than read once.
            assert thread.is_alive() and learner.policy.version > steps_before
            eventually(lambda: learner.service.connected_actors == 1, 10,
                       "the refused streams to leave, the good actor's alone connected")
        finally:
            learner.finish("test over")
            thread.join(timeout=30)
        assert not errors and good.steps_sent > 0


def _run(actor, errors):
    try:
        actor.run()
    except Exception as e:  # reported by the test
        errors.append(e)
