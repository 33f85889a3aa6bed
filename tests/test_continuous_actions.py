"""Gaussian policies with bounded actions: exact log-probs under tanh squashing and clipping."""

import pytest
import torch
from torch.distributions import Normal

from fleetrl.agents.distributions import ClippedNormal, SquashedNormal, bounded_normal
from fleetrl.problems import load_problem

LOW, HIGH = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])


def test_squashed_log_prob_is_the_change_of_variables():
    mean, std = torch.tensor([[0.3, -0.5]]), torch.tensor([[0.7, 1.2]])
    u = torch.tensor([[0.4, -1.1]])
    scale, loc = (HIGH - LOW) / 2, (HIGH + LOW) / 2
    action = loc + scale * torch.tanh(u)
    expected = (Normal(mean, std).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2) - torch.log(scale)).sum(-1)
    got = SquashedNormal(mean, std, LOW, HIGH).log_prob(action)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_squashed_samples_stay_inside_and_bound_actions_have_finite_log_prob():
    dist = SquashedNormal(torch.zeros(1000, 2), torch.full((1000, 2), 3.0), LOW, HIGH)
    samples = dist.sample()
    assert (samples >= LOW).all() and (samples <= HIGH).all()
    assert torch.isfinite(dist.log_prob(HIGH.expand(1000, 2))).all()


def test_clipped_normal_puts_the_tails_on_the_bounds():
    mean, std = torch.tensor([[1.5, 0.2]]), torch.tensor([[1.0, 0.5]])
    dist = ClippedNormal(mean, std, LOW, HIGH)
    base = Normal(mean, std)
    at_high = dist.log_prob(HIGH[None])
    assert at_high.item() == pytest.approx(torch.log(1 - base.cdf(HIGH[None])).sum().item(), rel=1e-5)
    at_low = dist.log_prob(LOW[None])
    assert at_low.item() == pytest.approx(torch.log(base.cdf(LOW[None])).sum().item(), rel=1e-5)
    # Per dimension, the mass inside plus the two bound masses is one.
    for d in range(2):
        grid = torch.linspace(LOW[d].item(), HIGH[d].item(), 20001)[1:-1]
        density = base.log_prob(grid[:, None].expand(-1, 2))[:, d].exp()
        inside = torch.trapezoid(density, grid).item()
        bounds = (base.cdf(LOW[None])[0, d] + 1 - base.cdf(HIGH[None])[0, d]).item()
        assert inside + bounds == pytest.approx(1.0, abs=1e-4)


def test_clipped_samples_land_on_the_bounds_with_the_tail_probability():
    torch.manual_seed(0)
    dist = ClippedNormal(torch.full((20000, 1), 1.5), torch.ones(20000, 1), LOW[:1], HIGH[:1])
    samples = dist.sample()
    expected = 1 - Normal(1.5, 1.0).cdf(torch.tensor(2.0)).item()
    assert (samples == 2.0).float().mean().item() == pytest.approx(expected, abs=0.01)


def test_the_problem_takes_its_bounds_from_the_action_space():
    problem = load_problem("pendulum", {"action_squash": "clip"})
    agent = problem.make_agent()
    out, _ = agent.step({"observation": torch.randn(64, 3)}, torch.ones(64, dtype=torch.bool), ())
    out["action_mean"] = out["action_mean"] + 5  # push the policy against the upper bound
    actions = problem.select_actor_action(out, {}, {})["action"]
    assert actions.shape == (64, 1) and actions.dtype == torch.float32
    assert actions.max().item() == 2.0 and actions.min().item() >= -2.0
    assert torch.isfinite(problem.action_log_prob(out, {"action": actions})).all()
    with pytest.raises(ValueError, match="unknown action squashing 'cube'"):
        bounded_normal("cube", torch.zeros(1, 1), torch.zeros(1, 1), -1, 1)
