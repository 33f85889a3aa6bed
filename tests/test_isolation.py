"""Failures stay with the actor that caused them: the learner keeps serving and training the rest.

Two layers. Float observations are checked when they are decoded, so a NaN or infinity
ends only the sending actor's stream, by name (INVALID_ARGUMENT: the actor's fault, final).
And should a step still make the agent raise inside a shared inference batch, the batch is
retried request by request: only the request that fails on its own ends its stream, with a
status the actor retries (the failure is the learner's: an out-of-memory, a bug); its
batch-mates get their actions. A failure that repeats for every actor stops the run.
"""

import threading

import grpc
import numpy as np
import pytest
import torch

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.agents import MLPAgent
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.problems.cartpole import CartPoleProblem

POISON = 1e6  # finite, so it passes decoding, but this agent refuses it


class PoisonedAgent(MLPAgent):
    """CartPole's MLP, except that it raises on an observation above POISON (a stand-in for
    any input a model cannot take: a wrong token id, a value that overflows a kernel)."""

    def torso(self, observation):
        if bool((observation["observation"].abs() > POISON).any()):
            raise ValueError("Expected parameter logits to satisfy the constraint Real(), but found invalid values")
        return super().torso(observation)


class PoisonedCartPole(CartPoleProblem):
    def make_agent(self):
        (spec,) = self.observation_specs()
        return PoisonedAgent(spec.shape[0], self.policy_logits_size(), self.config.hidden_sizes, shared_torso=False)


@pytest.fixture
def learner_and_healthy_actor(tmp_path, eventually):
    """A CartPole learner whose batches wait for every connected env, and one healthy actor
    training on it in a thread."""
    config = LearnerConfig(bind="127.0.0.1:0", logdir=str(tmp_path), batch_size=4, unroll_length=10,
                           inference_timeout_ms=500, summary_interval_s=0.5)
    learner = Learner(config, problem=PoisonedCartPole())
    learner_thread = threading.Thread(target=learner.run, daemon=True)
    learner_thread.start()
    healthy = Actor(ActorConfig(learner_address=learner.address, problem="cartpole", num_envs=8, actor_id="healthy"))
    errors = []
    actor_thread = threading.Thread(target=lambda: _run(healthy, errors), daemon=True)
    actor_thread.start()
    eventually(lambda: learner.policy.version >= 2, 60, "training to start")
    yield learner, healthy, errors
    learner.finish("test over")
    actor_thread.join(timeout=30)
    learner_thread.join(timeout=30)
    assert not errors, errors


def _run(actor, errors):
    try:
        actor.run()
    except Exception as e:  # reported by the fixture
        errors.append(e)


def _refusal(learner, raw_actor, wire, observation):
    bad = raw_actor(learner.address)
    assert bad.send(wire.handshake(actor_id="bad")).WhichOneof("kind") == "accepted"
    with pytest.raises(grpc.RpcError) as info:
        bad.send(wire.cartpole_step(obs=observation))
    return info.value


def _still_training(learner, healthy, eventually):
    version, steps = learner.policy.version, healthy.steps_sent
    eventually(lambda: learner.policy.version > version + 2 and healthy.steps_sent > steps + 20, 60, "more training")
    eventually(lambda: learner.service.connected_actors == 1, 10, "the refused stream to leave")
    assert not learner.is_finished()


def test_a_nan_observation_is_refused_by_name_and_the_healthy_actor_keeps_training(
        learner_and_healthy_actor, raw_actor, wire, eventually):
    learner, healthy, _ = learner_and_healthy_actor
    observation = np.zeros((2, 4), np.float32)
    observation[1, 2] = np.nan
    error = _refusal(learner, raw_actor, wire, observation)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "actor 'bad': observation 'observation': env 1 has a NaN or infinite value" in error.details()
    assert learner.service.rejected_messages == 1
    _still_training(learner, healthy, eventually)


def test_a_step_that_breaks_a_shared_batch_fails_alone_and_its_batch_mates_are_served(
        learner_and_healthy_actor, raw_actor, wire, eventually):
    learner, healthy, _ = learner_and_healthy_actor
    observation = np.zeros((2, 4), np.float32)
    observation[0, 0] = 2 * POISON
    error = _refusal(learner, raw_actor, wire, observation)
    # Its message passed every check, so the failure is the learner's: a status the actor retries.
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "actor 'bad': the learner's inference failed on this step (ValueError: " in error.details()
    assert "back off and resend it" in error.details()
    # It failed inside a batch shared with the healthy actor's envs, which was then retried
    # request by request: the healthy request got its actions, the poisoned one its error.
    assert learner.batcher.isolated_failures >= 1
    assert learner.service.rejected_messages == 1
    _still_training(learner, healthy, eventually)
    with torch.no_grad():  # and the model itself is unharmed
        out, _ = learner.agent.step({"observation": torch.zeros(1, 4)}, torch.ones(1, dtype=torch.bool), ())
    assert torch.isfinite(out["policy_logits"]).all()


class FlakyAgent(MLPAgent):
    """CartPole's MLP whose inference forward passes `fail_at` (numbered from 1) raise CUDA's
    out-of-memory error, as a learner on a full GPU would. Training's passes (not under
    inference mode) are neither counted nor failed: a trainer's error ends the run."""

    def __init__(self, *args, fail_at=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.fail_at = 0, set(fail_at)

    def torso(self, observation):
        if not torch.is_inference_mode_enabled():
            return super().torso(observation)
        self.calls += 1
        if self.calls in self.fail_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return super().torso(observation)


class FlakyCartPole(CartPoleProblem):
    def __init__(self, fail_at, config=None):
        super().__init__(config)
        self.fail_at = fail_at

    def make_agent(self):
        (spec,) = self.observation_specs()
        return FlakyAgent(spec.shape[0], self.policy_logits_size(), self.config.hidden_sizes, shared_torso=False,
                          fail_at=self.fail_at)


def _learner(tmp_path, problem) -> tuple[Learner, threading.Thread]:
    config = LearnerConfig(bind="127.0.0.1:0", logdir=str(tmp_path), batch_size=4, unroll_length=10,
                           summary_interval_s=0.5)
    learner = Learner(config, problem=problem)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    return learner, thread


def test_an_out_of_memory_in_a_forward_pass_is_the_learners_and_every_actor_carries_on(tmp_path, eventually,
                                                                                        caplog):
    # Inference passes 30 and 31 fail: a batch, then a request on its own (or the next batch).
    learner, learner_thread = _learner(tmp_path, FlakyCartPole(fail_at=(30, 31)))
    actors = [Actor(ActorConfig(learner_address=learner.address, problem="cartpole", num_envs=4,
                                actor_id=f"actor-{i}", max_reconnect_s=60)) for i in range(2)]
    errors = []
    threads = [threading.Thread(target=_run, args=(actor, errors), daemon=True) for actor in actors]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: learner.agent.calls > 31, 60, "the injected out-of-memory")
        steps = [actor.steps_sent for actor in actors]
        eventually(lambda: all(a.steps_sent > s + 50 for a, s in zip(actors, steps)), 60, "every actor to go on")
        assert not learner.is_finished() and not errors, errors
        assert learner.service.failures.total >= 1
        logged = [r for r in caplog.records if "the learner's inference failed" in r.getMessage()]
        assert logged and logged[0].exc_info and "OutOfMemoryError" in repr(logged[0].exc_info[1])
    finally:
        learner.finish("test over")
        for thread in (*threads, learner_thread):
            thread.join(timeout=30)
    assert not errors, errors


def test_a_failure_that_repeats_for_every_actor_stops_the_run_with_the_learners_error(tmp_path, eventually):
    learner, learner_thread = _learner(tmp_path, FlakyCartPole(fail_at=range(20, 10_000)))
    actor = Actor(ActorConfig(learner_address=learner.address, problem="cartpole", num_envs=4, max_reconnect_s=5))
    errors = []
    thread = threading.Thread(target=_run, args=(actor, errors), daemon=True)
    thread.start()
    try:
        eventually(learner.is_finished, 60, "the run to stop")
        assert learner.finished_reason().startswith("error: inference failed on every actor's steps, twice each: "
                                                    "OutOfMemoryError: CUDA out of memory")
    finally:
        learner.finish("test over")
        learner_thread.join(timeout=30)
        thread.join(timeout=30)
