"""The learner's data path, end to end without training: actor -> gRPC -> batcher -> state store -> unrolls.

Replaying the unrolls through `Agent.unroll` with the weights that produced them must give
back the behaviour log-probs exactly: this checks the recurrent state kept per env, the
state stored at each unroll's start, the `first` flags and the one-step overlap at once.
"""

import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.problems import load_problem
from fleetrl.problems.cartpole import CartPoleProblem
from fleetrl.proto.tensors import TensorSpec

T = 10


@pytest.fixture
def serving_learner(tmp_path):
    """A learner whose server and batcher run, but whose trainer does not: the weights stay fixed."""

    def start(problem: str, bind: str, **hparams: str):
        learner = Learner(LearnerConfig(problem=problem, bind=bind, logdir=str(tmp_path), unroll_length=T,
                                        unroll_queue_size=10_000, hparams={"max_episode_steps": "15", **hparams}))
        learner.server.start()  # and its batchers
        started.append(learner)
        return learner

    started = []
    yield start
    for learner in started:
        learner.finish("test over")
        learner.server.stop(0).wait()


def run_actors(learner, address, num_actors=2, steps=60):
    problem = load_problem(learner.config.problem, learner.config.hparams)
    actors = [Actor(ActorConfig(learner_address=address, problem=learner.config.problem, num_envs=3,
                                actor_id=f"a{i}", seed=i), problem) for i in range(num_actors)]
    threads = [threading.Thread(target=a.run, kwargs={"max_steps": steps}) for a in actors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return actors


@pytest.mark.parametrize("problem", ["cartpole", "cartpole_lstm"])
def test_replayed_unrolls_reproduce_the_behaviour_policy(serving_learner, problem):
    learner = serving_learner(problem, "127.0.0.1:0")
    actors = run_actors(learner, learner.address)
    assert all(a.steps_sent == 60 for a in actors)
    batch = learner.unrolls.get_batch(learner.unrolls.qsize())
    # 2 actors x 3 envs, 60 steps each: 5 full unrolls of T+1 steps per env (overlapping by one).
    assert batch.batch_size == 2 * 3 * 5 and batch.first.shape[0] == T + 1
    assert batch.first[1:].any()  # episodes of at most 15 steps start again inside unrolls
    with torch.no_grad():
        outputs, _ = learner.agent.unroll(batch.observation, batch.first, batch.initial_state)
        replayed = learner.problem.action_log_prob(outputs, batch.action)
    torch.testing.assert_close(replayed, batch.behaviour_log_prob, rtol=1e-5, atol=1e-5)


def test_actors_can_reach_the_learner_over_a_unix_socket(serving_learner, tmp_path):
    socket_path = tmp_path / "learner.sock"
    learner = serving_learner("cartpole", f"unix:{socket_path}")
    assert learner.address == f"unix:{socket_path}"
    actors = run_actors(learner, learner.address, num_actors=1, steps=2 * T + 1)
    assert actors[0].steps_sent == 2 * T + 1
    assert learner.unrolls.qsize() == 3 * 2  # 3 envs, 2 unrolls each


def test_an_actor_can_step_its_envs_in_subprocesses(serving_learner):
    learner = serving_learner("cartpole", "127.0.0.1:0")
    problem = load_problem(learner.config.problem, learner.config.hparams)
    actor = Actor(ActorConfig(learner_address=learner.address, problem="cartpole", num_envs=3, actor_id="async",
                              async_envs=True), problem)
    actor.run(max_steps=2 * T + 1)
    assert actor.steps_sent == 2 * T + 1
    assert learner.unrolls.qsize() == 3 * 2


def test_chunks_of_actions_reach_the_learner_with_each_actions_reward(serving_learner):
    """CartPole in chunks of 4 with 15-step episodes: every episode's last chunk stops early."""
    learner = serving_learner("cartpole", "127.0.0.1:0", chunk_size="4")
    run_actors(learner, learner.address, num_actors=1, steps=3 * T + 1)
    batch = learner.unrolls.get_batch(learner.unrolls.qsize())
    action_rewards, executed = batch.extras["action_rewards"], batch.extras["actions_executed"]
    assert batch.action["action"].shape == (T + 1, 3 * 3, 4) and action_rewards.shape == (T + 1, 3 * 3, 4)
    torch.testing.assert_close(action_rewards.sum(-1), batch.reward)
    ended = batch.terminated | batch.truncated
    assert torch.all(executed[batch.first] == 0)  # a reset runs no action
    assert torch.all(executed[~ended & ~batch.first] == 4)
    assert torch.all((executed[ended] >= 1) & (executed[ended] <= 4)) and torch.any(executed[ended] < 4)
    # Rewards of CartPole are 1 per action that ran, and 0 for the rest of a chunk.
    ran = torch.arange(4) < executed.unsqueeze(-1)
    assert torch.all(action_rewards[ran] == 1) and torch.all(action_rewards[~ran] == 0)
    with torch.no_grad():
        outputs, _ = learner.agent.unroll(batch.observation, batch.first, batch.initial_state)
        replayed = learner.problem.action_log_prob(outputs, batch.action)
    assert replayed.shape == (T + 1, 9, 4)
    torch.testing.assert_close(replayed, batch.behaviour_log_prob, rtol=1e-5, atol=1e-5)


class StepCost(gym.Wrapper):
    """A user's own per-step feature: each step's cost, in the step's info."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "cost": np.float32(abs(obs[2]))}


class CostedCartPole(CartPoleProblem):
    """Declares the feature's extra: the only change a new per-step field needs."""

    def make_actor_env(self):
        return StepCost(super().make_actor_env())

    def extra_specs(self):
        return super().extra_specs() + (TensorSpec("cost", np.dtype(np.float32), ()),)


def test_a_users_own_per_step_field_reaches_the_batch_by_name(tmp_path):
    problem = CostedCartPole(CartPoleProblem.Config(max_episode_steps=15))
    learner = Learner(LearnerConfig(bind="127.0.0.1:0", logdir=str(tmp_path), unroll_length=T,
                                    unroll_queue_size=10_000), problem=problem)
    learner.server.start()  # and its batchers
    try:
        actor = Actor(ActorConfig(learner_address=learner.address, problem="cartpole", num_envs=3), problem)
        actor.run(max_steps=2 * T + 1)
        batch = learner.unrolls.get_batch(learner.unrolls.qsize())
    finally:
        learner.finish("test over")
        learner.server.stop(0).wait()
    cost = batch.extras["cost"]
    assert cost.shape == batch.reward.shape and cost.dtype == torch.float32
    # The cost is |pole angle| of the observation the step arrived at; a reset reports none (0).
    torch.testing.assert_close(cost[~batch.first], batch.observation["observation"][..., 2].abs()[~batch.first])
    assert torch.all(cost[batch.first] == 0)
