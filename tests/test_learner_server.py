"""The learner's gRPC service: handshakes, actions, and clear rejections that spare other actors."""

import concurrent.futures
import threading
import time

import grpc
import numpy as np
import pytest

from fleetrl.agents import MLPAgent
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.problems.cartpole import CartPoleProblem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.tensors import decode


@pytest.fixture
def learner(serve):
    return serve(hparams={"max_episode_steps": "200"})


@pytest.fixture
def rejection(raw_actor):
    def refused(learner, *messages) -> tuple[grpc.StatusCode, str]:
        actor = raw_actor(learner.address)
        with pytest.raises(grpc.RpcError) as info:
            for message in messages:
                actor.send(message)
        return info.value.code(), info.value.details()

    return refused


def test_run_info_tells_actors_the_problem_and_hparams(learner, raw_actor):
    info = raw_actor(learner.address).stub.GetRunInfo(pb.RunInfoRequest())
    assert info.problem == "cartpole" and dict(info.hparams) == {"max_episode_steps": "200"}


def test_a_handshake_then_steps_get_actions(learner, raw_actor, wire):
    actor = raw_actor(learner.address)
    assert actor.send(wire.handshake(num_envs=3)).WhichOneof("kind") == "accepted"
    for _ in range(3):
        reply = actor.send(wire.cartpole_step(3))
        action = decode(reply.actions.actions[0], batch=3)
        assert action.dtype == np.int64 and set(action.tolist()) <= {0, 1}


BAD_HANDSHAKES = {
    "other problem": (lambda w: w.handshake(problem="atari"), grpc.StatusCode.FAILED_PRECONDITION,
                      "the actor runs problem 'atari' and the learner serves 'cartpole'"),
    "wrong shape": (lambda w: w.handshake(obs_shape=(5,)), grpc.StatusCode.FAILED_PRECONDITION,
                    "the observation 'observation' has shape [5] where the learner expects [4]"),
    "wrong dtype": (lambda w: w.handshake(obs_dtype=np.float64), grpc.StatusCode.FAILED_PRECONDITION,
                    "has dtype float64"),
    "a step first": (lambda w: w.cartpole_step(), grpc.StatusCode.INVALID_ARGUMENT,
                     "the first message of a stream must be a handshake"),
    "too many envs": (lambda w: w.handshake(num_envs=5000), grpc.StatusCode.FAILED_PRECONDITION, "num_envs = 5000"),
    "undeclared extra": (lambda w: w.handshake(extra_specs=[pb.TensorSpec(name="x", dtype=pb.FLOAT32)]),
                         grpc.StatusCode.FAILED_PRECONDITION, "the actor sends extra 'x', which the learner does not"),
    "empty message": (lambda w: pb.ActorMessage(), grpc.StatusCode.INVALID_ARGUMENT,
                      "an empty ActorMessage: set its handshake or its step"),
}


@pytest.mark.parametrize("case", sorted(BAD_HANDSHAKES))
def test_bad_handshakes_are_refused_with_the_mismatch_named(learner, rejection, wire, case):
    message, code, text = BAD_HANDSHAKES[case]
    got_code, details = rejection(learner, message(wire))
    assert got_code == code and text in details


BAD_STEPS = {
    "wrong dtype": (lambda w: w.cartpole_step(obs=np.zeros((2, 4), np.float64)), "dtype FLOAT64 differs"),
    "wrong shape": (lambda w: w.cartpole_step(obs=np.zeros((2, 5), np.float32)), "shape [2, 5] differs"),
    "truncated bytes": (lambda w: w.cartpole_step(
        obs=pb.Tensor(name="observation", dtype=pb.FLOAT32, shape=[2, 4], data=b"1234")), "4 bytes of data"),
    "nan reward": (lambda w: w.cartpole_step(rewards=[1.0, float("nan")]), "env 1 has a NaN or infinite reward"),
    "infinite observation": (lambda w: w.cartpole_step(obs=np.array([[0, 0, 0, 0], [0, np.inf, 0, 0]], np.float32)),
                             "observation 'observation': env 1 has a NaN or infinite value"),
    "unknown env": (lambda w: w.cartpole_step(env_indices=[0, 7]), "env index 7 is unknown"),
    "repeated env": (lambda w: w.cartpole_step(env_indices=[1, 1]), "env_indices repeats an env"),
    "repeated handshake": (lambda w: w.handshake(actor_id="b"), "handshake repeated"),
    "empty message": (lambda w: pb.ActorMessage(), "an empty ActorMessage"),
    "undeclared extra": (lambda w: w.cartpole_step(extras={"action_rewards": np.ones((2, 3), np.float32)}),
                         "extra 'action_rewards' is not in the handshake spec (expected [])"),
}


@pytest.mark.parametrize("case", sorted(BAD_STEPS))
def test_bad_steps_are_rejected_and_other_actors_keep_being_served(learner, raw_actor, rejection, wire, case):
    good = raw_actor(learner.address)
    good.send(wire.handshake(actor_id="good"))
    good.send(wire.cartpole_step())
    message, text = BAD_STEPS[case]
    code, details = rejection(learner, wire.handshake(actor_id="bad"), message(wire))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text in details
    assert good.send(wire.cartpole_step()).WhichOneof("kind") == "actions"
    assert learner.service.rejected_messages == 1


def test_two_actors_cannot_share_an_id(learner, raw_actor, rejection, wire):
    raw_actor(learner.address).send(wire.handshake(actor_id="same"))
    code, details = rejection(learner, wire.handshake(actor_id="same"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "'same'" in details


def test_a_refused_stream_is_forgotten_before_its_status_so_its_actor_can_reconnect_at_once(serve, raw_actor,
                                                                                            rejection, wire):
    """The status reaches the client only after the stream has left the learner's records:
    an actor that reconnects the moment it is refused meets neither ALREADY_EXISTS for its own
    id nor RESOURCE_EXHAUSTED for its own place under --max_actors. Repeated, since the order
    of two events is what is tested."""
    learner = serve(max_actors=1)
    refusals = {"a NaN observation": wire.cartpole_step(obs=np.full((2, 4), np.nan, np.float32)),
                "a repeated handshake": wire.handshake(actor_id="same")}
    for i in range(40):
        name = sorted(refusals)[i % 2]
        code, details = rejection(learner, wire.handshake(actor_id="same"), refusals[name])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (i, name, code, details)
        assert learner.service.connected_actors == 0, (i, name)
    again = raw_actor(learner.address)
    assert again.send(wire.handshake(actor_id="same")).WhichOneof("kind") == "accepted"
    assert again.send(wire.cartpole_step()).WhichOneof("kind") == "actions"


def test_finished_run_tells_actors_so(learner, raw_actor, wire):
    actor = raw_actor(learner.address)
    actor.send(wire.handshake())
    learner.finish("enough")
    reply = actor.send(wire.cartpole_step())
    assert reply.WhichOneof("kind") == "finished" and reply.finished.reason == "enough"


def test_grpo_learners_refuse_actors_whose_envs_do_not_form_whole_groups(serve, raw_actor, rejection, wire):
    learner = serve(hparams={"algorithm": "grpo", "group_size": "4"})
    code, details = rejection(learner, wire.handshake(num_envs=6))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a multiple of group_size 4" in details
    assert raw_actor(learner.address).send(wire.handshake(num_envs=8)).WhichOneof("kind") == "accepted"
    assert raw_actor(learner.address).stub.GetRunInfo(pb.RunInfoRequest()).num_envs_multiple == 4


CHUNK_SPECS = [pb.TensorSpec(name="action_rewards", dtype=pb.FLOAT32, shape=[3]),
               pb.TensorSpec(name="actions_executed", dtype=pb.INT64)]


def chunked_step(wire, action_rewards=None, executed=(3, 3)):
    extras = {"actions_executed": np.array(executed, np.int64)}
    if action_rewards is not None:
        extras["action_rewards"] = action_rewards
    return wire.cartpole_step(extras=extras)


CHUNK_STEPS = {
    "missing action rewards": (lambda w: chunked_step(w, None), "extra ['action_rewards'] missing from the message"),
    "wrong chunk length": (lambda w: chunked_step(w, np.ones((2, 4), np.float32)), "shape [2, 4] differs"),
    "nan action reward": (lambda w: chunked_step(w, np.array([[1, 1, 1], [1, np.inf, 0]], np.float32)),
                          "extra 'action_rewards': env 1 has a NaN or infinite value"),
    "too many executed": (lambda w: chunked_step(w, np.ones((2, 3), np.float32), executed=(3, 9)),
                          "extra 'actions_executed': env 1 has 9, outside [0, 3]"),
}


@pytest.mark.parametrize("case", sorted(CHUNK_STEPS))
def test_bad_chunk_results_are_rejected_by_name(serve, raw_actor, rejection, wire, case):
    learner = serve(hparams={"chunk_size": "3"})
    good = raw_actor(learner.address)
    good.send(wire.handshake(actor_id="good", action_shape=(3,), extra_specs=CHUNK_SPECS))
    message, text = CHUNK_STEPS[case]
    code, details = rejection(learner, wire.handshake(actor_id="bad", action_shape=(3,), extra_specs=CHUNK_SPECS),
                              message(wire))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text in details
    reply = good.send(chunked_step(wire, np.ones((2, 3), np.float32)))
    assert decode(reply.actions.actions[0], batch=2).shape == (2, 3)


def test_unchunked_problems_refuse_chunk_results(learner, rejection, wire):
    code, details = rejection(learner, wire.handshake(), chunked_step(wire, np.ones((2, 3), np.float32)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "is not in the handshake spec (expected [])" in details


HOLD = 1e6  # an observation value that makes HeldAgent wait for the test's release


class HeldAgent(MLPAgent):
    """CartPole's MLP, except that a step with an observation of HOLD waits in its forward
    pass until the test releases it: a forward pass as long as a VLM's generation."""

    held = threading.Event()
    release = threading.Event()

    def torso(self, observation):
        if bool((observation["observation"] == HOLD).any()):
            HeldAgent.held.set()
            assert HeldAgent.release.wait(timeout=60)
        return super().torso(observation)


class HeldCartPole(CartPoleProblem):
    def make_agent(self):
        (spec,) = self.observation_specs()
        return HeldAgent(spec.shape[0], self.policy_logits_size(), self.config.hidden_sizes, shared_torso=False)


def test_the_server_keeps_answering_while_a_forward_pass_runs(tmp_path, raw_actor, wire):
    """The forward pass runs off the server's event loop: while one is held, the loop still
    answers side calls and takes new actors in, and the held step is answered once it ends."""
    learner = Learner(LearnerConfig(bind="127.0.0.1:0", logdir=str(tmp_path), inference_timeout_ms=1),
                      problem=HeldCartPole())
    runner = threading.Thread(target=learner.run, daemon=True)
    runner.start()
    HeldAgent.held.clear()
    HeldAgent.release.clear()
    try:
        held = raw_actor(learner.address)
        assert held.send(wire.handshake(actor_id="held", num_envs=1)).WhichOneof("kind") == "accepted"
        observation = np.full((1, 4), HOLD, np.float32)
        answer = concurrent.futures.ThreadPoolExecutor(1).submit(held.send, wire.cartpole_step(1, obs=observation))
        assert HeldAgent.held.wait(timeout=30) and not answer.done()
        other = raw_actor(learner.address)
        started = time.monotonic()
        assert other.stub.GetStatus(pb.StatusRequest(), timeout=5).connected_actors == 1
        assert other.send(wire.handshake(actor_id="other", num_envs=1)).WhichOneof("kind") == "accepted"
        assert other.stub.GetRunInfo(pb.RunInfoRequest(), timeout=5).problem == "cartpole"
        assert time.monotonic() - started < 5 and not answer.done()
        HeldAgent.release.set()
        assert answer.result(timeout=30).WhichOneof("kind") == "actions"
    finally:
        HeldAgent.release.set()
        learner.finish("test over")
        runner.join(timeout=30)


def test_a_held_eval_snapshot_delays_no_other_streams_step_or_handshake(tmp_path, raw_actor, wire):
    """A new eval round copies the model under the policy lock, which a training update may
    hold throughout (block_inference_on_training). While that copy waits, another eval
    stream's step and a new actor's handshake are answered at once."""
    learner = Learner(LearnerConfig(bind="127.0.0.1:0", logdir=str(tmp_path), inference_timeout_ms=1,
                                    eval_interval_s=0.0), problem=CartPoleProblem())
    runner = threading.Thread(target=learner.run, daemon=True)
    runner.start()

    def eval_actor(name):
        actor = raw_actor(learner.address)
        handshake = wire.handshake(actor_id=name, num_envs=1)
        handshake.handshake.mode = pb.EVAL
        assert actor.send(handshake).WhichOneof("kind") == "accepted"
        return actor

    holding = False
    try:
        playing = eval_actor("playing")
        work = playing.stub.GetEvalWork(pb.EvalWorkRequest(actor_id="playing", max_episodes=10_000), timeout=30)
        assert len(work.episodes) == learner.problem.num_eval_episodes()  # round 0, all of it
        learner.policy.lock.acquire()  # as a training update holds it
        holding = True
        asking = eval_actor("asking")
        new_round = concurrent.futures.ThreadPoolExecutor(1).submit(
            asking.stub.GetEvalWork, pb.EvalWorkRequest(actor_id="asking", max_episodes=1), timeout=60)
        time.sleep(0.5)
        assert not new_round.done()  # its snapshot waits for the lock
        calls = concurrent.futures.ThreadPoolExecutor(2)  # the old way, they waited for the lock
        step = calls.submit(playing.send, wire.cartpole_step(1))
        other = raw_actor(learner.address)
        handshake = calls.submit(other.send, wire.handshake(actor_id="other", num_envs=1))
        assert step.result(timeout=5).WhichOneof("kind") == "actions"
        assert handshake.result(timeout=5).WhichOneof("kind") == "accepted"
        assert not new_round.done()
        learner.policy.lock.release()
        holding = False
        assert new_round.result(timeout=30).round == 1
    finally:
        if holding:
            learner.policy.lock.release()
        learner.finish("test over")
        runner.join(timeout=30)
