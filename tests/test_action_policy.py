"""A Problem's action policy: the default, a Problem's own, and Problems written before it."""

import pytest
import torch

from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.cartpole import CartPoleProblem


def test_the_default_policy_is_categorical_over_the_action_space():
    problem = CartPoleProblem.from_hparams({})
    policy = problem.action_policy()
    assert type(policy) is ActionPolicy and policy.policy_logits_size() == 2
    out = {"policy_logits": torch.tensor([[0.0, 3.0], [2.0, 0.0]])}
    assert policy.select_actor_action(out, {}, {}, deterministic=True)["action"].tolist() == [1, 0]
    log_prob = policy.action_log_prob(out, {"action": torch.tensor([1, 1])})
    torch.testing.assert_close(log_prob, torch.log_softmax(out["policy_logits"], -1)[:, 1])


def test_a_problem_that_defines_policy_methods_itself_still_has_them_used():
    """Before action_policy(), a Problem overrode action_distribution on itself; it still
    decides the actions, the log-probs and the entropy, and the Problem still answers
    the policy's methods (docs' examples call self.policy_logits_size())."""

    class AlwaysRight(CartPoleProblem):
        def action_distribution(self, agent_output):
            return torch.distributions.Categorical(probs=torch.tensor([[0.0, 1.0]]).expand(
                agent_output["policy_logits"].shape[0], 2))

    problem = AlwaysRight.from_hparams({})
    out = {"policy_logits": torch.tensor([[5.0, -5.0], [5.0, -5.0]])}
    policy = problem.action_policy()
    assert policy.select_actor_action(out, {}, {})["action"].tolist() == [1, 1]
    assert policy.entropy(out).abs().max() < 1e-6  # the default logits would give 4.5e-4
    assert problem.policy_logits_size() == 2
    assert problem.select_actor_action(out, {}, {})["action"].tolist() == [1, 1]
    with pytest.raises(AttributeError, match="no attribute 'make_policy'"):
        problem.make_policy()
