"""The learner's gRPC service: handshakes, actions, and clear rejections that spare other actors."""

import grpc
import numpy as np
import pytest

from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.tensors import decode, encode

from helpers import RawActor, cartpole_step, handshake, running_learner


@pytest.fixture
def learner(tmp_path):
    with running_learner(tmp_path, hparams={"max_episode_steps": "200"}) as learner:
        yield learner


def rejection(learner, *messages):
    actor = RawActor(learner.address)
    try:
        with pytest.raises(grpc.RpcError) as info:
            for message in messages:
                actor.send(message)
        return info.value.code(), info.value.details()
    finally:
        actor.close()


def test_run_info_tells_actors_the_problem_and_hparams(learner):
    actor = RawActor(learner.address)
    info = actor.stub.GetRunInfo(pb.RunInfoRequest())
    actor.close()
    assert info.problem == "cartpole" and dict(info.hparams) == {"max_episode_steps": "200"}


def test_a_handshake_then_steps_get_actions(learner):
    actor = RawActor(learner.address)
    try:
        assert actor.send(handshake(num_envs=3)).WhichOneof("kind") == "accepted"
        for _ in range(3):
            reply = actor.send(cartpole_step(3))
            action = decode(reply.actions.actions[0], batch=3)
            assert action.dtype == np.int64 and set(action.tolist()) <= {0, 1}
    finally:
        actor.close()


@pytest.mark.parametrize("message,code,text", [
    (handshake(problem="atari"), grpc.StatusCode.FAILED_PRECONDITION,
     "the actor runs problem 'atari' and the learner serves 'cartpole'"),
    (handshake(obs_shape=(5,)), grpc.StatusCode.FAILED_PRECONDITION,
     "the observation 'observation' has shape [5] where the learner expects [4]"),
    (handshake(obs_dtype=np.float64), grpc.StatusCode.FAILED_PRECONDITION, "has dtype float64"),
    (cartpole_step(), grpc.StatusCode.INVALID_ARGUMENT, "the first message of a stream must be a handshake"),
    (handshake(num_envs=5000), grpc.StatusCode.FAILED_PRECONDITION, "num_envs = 5000"),
])
def test_bad_handshakes_are_refused_with_the_mismatch_named(learner, message, code, text):
    got_code, details = rejection(learner, message)
    assert got_code == code and text in details


BAD_STEPS = {
    "wrong dtype": (cartpole_step(obs=np.zeros((2, 4), np.float64)), "dtype FLOAT64 differs"),
    "wrong shape": (cartpole_step(obs=np.zeros((2, 5), np.float32)), "shape [2, 5] differs"),
    "truncated bytes": (cartpole_step(obs=pb.Tensor(name="observation", dtype=pb.FLOAT32, shape=[2, 4], data=b"1234")),
                        "4 bytes of data"),
    "nan reward": (cartpole_step(rewards=[1.0, float("nan")]), "env 1 has a NaN or infinite reward"),
    "unknown env": (cartpole_step(env_indices=[0, 7]), "env index 7 is unknown"),
    "repeated handshake": (handshake(actor_id="b"), "handshake repeated"),
}


@pytest.mark.parametrize("case", sorted(BAD_STEPS))
def test_bad_steps_are_rejected_and_other_actors_keep_being_served(learner, case):
    good = RawActor(learner.address)
    try:
        good.send(handshake(actor_id="good"))
        good.send(cartpole_step())
        message, text = BAD_STEPS[case]
        code, details = rejection(learner, handshake(actor_id="bad"), message)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and text in details
        assert good.send(cartpole_step()).WhichOneof("kind") == "actions"
        assert learner.service.rejected_messages == 1
    finally:
        good.close()


def test_two_actors_cannot_share_an_id(learner):
    first = RawActor(learner.address)
    try:
        first.send(handshake(actor_id="same"))
        code, details = rejection(learner, handshake(actor_id="same"))
        assert code == grpc.StatusCode.ALREADY_EXISTS and "'same'" in details
    finally:
        first.close()


def test_finished_run_tells_actors_so(learner):
    actor = RawActor(learner.address)
    try:
        actor.send(handshake())
        learner.finish("enough")
        reply = actor.send(cartpole_step())
        assert reply.WhichOneof("kind") == "finished" and reply.finished.reason == "enough"
    finally:
        actor.close()


def test_grpo_learners_refuse_actors_whose_envs_do_not_form_whole_groups(tmp_path):
    with running_learner(tmp_path, hparams={"algorithm": "grpo", "group_size": "4"}) as learner:
        code, details = rejection(learner, handshake(num_envs=6))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a multiple of group_size 4" in details
        actor = RawActor(learner.address)
        try:
            assert actor.send(handshake(num_envs=8)).WhichOneof("kind") == "accepted"
        finally:
            actor.close()


def chunked_step(action_rewards=None, executed=(3, 3)):
    message = cartpole_step()
    if action_rewards is not None:
        message.step.action_rewards.CopyFrom(encode("action_rewards", action_rewards))
    message.step.actions_executed.extend(executed)
    return message


CHUNK_STEPS = {
    "missing action rewards": (chunked_step(None), "action_rewards missing: this Problem plays chunks of 3 actions"),
    "wrong chunk length": (chunked_step(np.ones((2, 4), np.float32)), "shape [2, 4] differs"),
    "nan action reward": (chunked_step(np.array([[1, 1, 1], [1, np.inf, 0]], np.float32)),
                          "action_rewards: env 1 has a NaN or infinite reward"),
    "too many executed": (chunked_step(np.ones((2, 3), np.float32), executed=(3, 9)),
                          "actions_executed: 9 actions of a chunk of 3"),
}


@pytest.mark.parametrize("case", sorted(CHUNK_STEPS))
def test_bad_chunk_results_are_rejected_by_name(tmp_path, case):
    with running_learner(tmp_path, hparams={"chunk_size": "3"}) as learner:
        good = RawActor(learner.address)
        try:
            good.send(handshake(actor_id="good", action_shape=(3,)))
            message, text = CHUNK_STEPS[case]
            code, details = rejection(learner, handshake(actor_id="bad", action_shape=(3,)), message)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and text in details
            reply = good.send(chunked_step(np.ones((2, 3), np.float32)))
            assert decode(reply.actions.actions[0], batch=2).shape == (2, 3)
        finally:
            good.close()


def test_unchunked_problems_refuse_chunk_results(learner):
    code, details = rejection(learner, handshake(), chunked_step(np.ones((2, 3), np.float32)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "this Problem has no action chunks" in details
