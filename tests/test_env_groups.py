"""Actors whose envs take turns in groups (double buffering) play and record exactly what
ungrouped actors do: the same episodes, actions and unrolls on the learner."""

import numpy as np
import pytest
import torch

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.config import ActorConfig
from fleetrl.actor.env_groups import group_bounds
from fleetrl.envs.vector import make_vector_env
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.cartpole import CartPoleLSTMProblem
from fleetrl.problems.registry import load_problem

T = 6


def test_groups_split_the_envs_as_evenly_as_whole_grpo_groups_allow():
    assert group_bounds(5, 1) == [(0, 5)]
    assert group_bounds(5, 2) == [(0, 3), (3, 5)]
    assert group_bounds(12, 2, group_size=4) == [(0, 8), (8, 12)]
    with pytest.raises(ValueError, match="only 3 groups of 4 envs"):
        group_bounds(12, 4, group_size=4)
    with pytest.raises(ValueError, match="only 1 envs"):
        group_bounds(1, 2)


def test_a_group_of_grpo_envs_resets_as_the_same_envs_of_the_whole_set():
    make = load_problem("cartpole").make_actor_env
    whole = make_vector_env(make, 6, group_size=2, seed=7)
    part = make_vector_env(make, 2, group_size=2, seed=7, first_env=4)
    try:
        np.testing.assert_array_equal(whole.reset()[0][4:], part.reset()[0])
    finally:
        whole.close()
        part.close()


class GreedyPolicy(ActionPolicy):
    def select_actor_action(self, agent_output, observation, extras, deterministic=False):
        return super().select_actor_action(agent_output, observation, extras, deterministic=True)


class GreedyCartPoleLSTM(CartPoleLSTMProblem):
    """Deterministic actions, so that two runs can be compared step by step."""

    def action_policy(self):
        return GreedyPolicy(self.config, self.action_space())


def recorded_unrolls(tmp_path, env_groups: int, steps_per_env: int) -> dict:
    problem = GreedyCartPoleLSTM(CartPoleLSTMProblem.Config(max_episode_steps=9))
    learner = Learner(LearnerConfig(problem="cartpole_lstm", bind="127.0.0.1:0", logdir=str(tmp_path / str(env_groups)),
                                    unroll_length=T, seed=1), problem=problem)
    unrolls = []
    learner.inference.emit_unroll = lambda unroll: unrolls.append(unroll) or True
    learner.server.start()  # and its batchers
    try:
        actor = Actor(ActorConfig(learner_address=learner.address, problem="cartpole_lstm", num_envs=5,
                                  env_groups=env_groups, seed=3), problem)
        actor.run(max_steps=steps_per_env * env_groups)
        assert actor.steps_sent == steps_per_env * env_groups
    finally:
        learner.finish("test over")
        learner.server.stop(0).wait()
    return {(u.slot, u.index): u for u in unrolls}


def test_envs_in_two_groups_give_the_same_actions_and_unrolls_as_in_one(tmp_path):
    plain = recorded_unrolls(tmp_path, env_groups=1, steps_per_env=4 * T + 1)
    grouped = recorded_unrolls(tmp_path, env_groups=2, steps_per_env=4 * T + 1)
    assert sorted(plain) == sorted(grouped) == [(slot, i) for slot in range(5) for i in range(4)]
    for key, unroll in plain.items():
        other = grouped[key]
        assert unroll.steps.keys() == other.steps.keys()
        # What the envs did is equal exactly; what the model computed, up to the float sums of
        # batches of other sizes (5 envs against 3 and 2).
        for field, value in unroll.steps.items():
            exact = field.startswith(("observation/", "action/")) or field in ("first", "reward", "terminated")
            torch.testing.assert_close(other.steps[field], value, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6,
                                       msg=f"{key} {field}")
        torch.testing.assert_close(other.initial_state, unroll.initial_state, rtol=1e-5, atol=1e-6)
    # Episodes of at most 9 steps end and restart inside the unrolls compared.
    assert any(u.steps["first"][1:].any() for u in plain.values())


def test_more_env_groups_than_envs_is_refused_by_name():
    with pytest.raises(ValueError, match="env_groups must be in"):
        ActorConfig(num_envs=2, env_groups=3)


def test_groups_that_would_split_a_grpo_group_are_refused_by_name():
    problem = load_problem("cartpole", {"algorithm": "grpo", "group_size": "4"})
    actor = Actor(ActorConfig(learner_address="127.0.0.1:1", problem="cartpole", num_envs=4, env_groups=2), problem)
    with pytest.raises(ActorError, match="only 1 groups of 4 envs"):
        actor.run(max_steps=1)
