"""The flow-matching sampler: its transitions against the formulas written out naively, the
SDE's marginals, and log-probs that training recomputes from the recorded chains."""

import math

import pytest
import torch
from torch import nn

from fleetrl.agents.pi0.sampler import (
    FlowSamplerConfig,
    chain_log_prob,
    gaussian_log_prob,
    sample,
    timesteps,
    transition,
)

H, D, REAL = 3, 6, 4  # a chunk of 3 actions, 6 dims of which the task uses 4
MASK = torch.tensor([1.0] * REAL + [0.0] * (D - REAL))


class ToyExpert(nn.Module):
    """A velocity of (x, t, the row's prefix) and a bounded noise head, as an expert has."""

    def __init__(self, batch: int):
        super().__init__()
        torch.manual_seed(0)
        self.prefix = torch.randn(batch, 8)
        self.net = nn.Sequential(nn.Linear(D + 1 + 8, 32), nn.Tanh(), nn.Linear(32, 2 * D))

    def forward(self, x, t, rows):
        inputs = torch.cat([x, t.view(-1, 1, 1).expand(-1, H, 1), self.prefix[rows].unsqueeze(1).expand(-1, H, -1)], -1)
        v, raw_std = self.net(inputs).chunk(2, dim=-1)
        return v, 0.08 + 0.08 * torch.sigmoid(raw_std)  # RLinf's bounds, [0.08, 0.16]


def naive_transition(method, noise_level, k_steps, step, x, v, learned_std):
    """One element's mean and std, from the formulas of docs/flow_vla.md in plain floats."""
    t = 1 - step / k_steps
    t_next = 1 - (step + 1) / k_steps
    d = t - t_next
    if method == "flow_noise":
        return x - d * v, learned_std
    x0, x1 = x - v * t, x + v * (1 - t)
    sigma = noise_level * math.sqrt(t / (1 - (1 - 1 / k_steps if t == 1 else t)))
    return x0 * (1 - (t - d)) + x1 * (t - d - sigma**2 * d / (2 * t)), math.sqrt(d) * sigma


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
@pytest.mark.parametrize("k_steps", [1, 3, 5])
def test_transitions_follow_the_formulas(method, k_steps):
    config = FlowSamplerConfig(denoise_steps=k_steps, noise_method=method, noise_level=0.7)
    generator = torch.Generator().manual_seed(1)
    x, v = torch.randn(k_steps, 2, 2, generator=generator), torch.randn(k_steps, 2, 2, generator=generator)
    learned = torch.rand(k_steps, 2, 2, generator=generator)
    steps = torch.arange(k_steps)
    mean, std = transition(config, x, steps, v, learned, torch.ones(k_steps, dtype=torch.bool))
    for i, j, m in [(s, a, b) for s in range(k_steps) for a in range(2) for b in range(2)]:
        want_mean, want_std = naive_transition(method, 0.7, k_steps, i, float(x[i, j, m]), float(v[i, j, m]),
                                               float(learned[i, j, m]))
        assert mean[i, j, m].item() == pytest.approx(want_mean, abs=1e-5)
        assert std[i, j, m].item() == pytest.approx(want_std, abs=1e-5)


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
def test_a_step_not_chosen_stochastic_is_the_euler_step(method):
    config = FlowSamplerConfig(denoise_steps=4, noise_method=method)
    x, v = torch.randn(4, H, D), torch.randn(4, H, D)
    mean, std = transition(config, x, torch.arange(4), v, torch.rand(4, H, D), torch.zeros(4, dtype=torch.bool))
    torch.testing.assert_close(mean, x - v / 4, atol=1e-6, rtol=0)
    assert (std == 0).all()


def test_the_sde_keeps_the_flows_marginals():
    """For actions all equal to A, the exact velocity is (x - A) / t and x_t ~ N((1-t)A, t^2).
    The SDE's samples must keep that mean and std at every grid point (a wrong drift
    correction widens or narrows them) and end at A, up to the discretization, which fine
    steps make small: at K=100, 0.81 for 0.8 at t=0.8, 0.406 for 0.4 at t=0.4 (0.464 at K=5);
    with the ODE's mean (no correction) it is 0.66 at t=0.4."""
    a = torch.tensor([0.5, -1.0, 2.0, 0.0])
    k_steps, batch = 100, 20000
    states = {}

    def exact(x, t, rows):
        states.setdefault(round(float(t[0]), 6), x[:, 0, :REAL].clone())
        return (x - torch.cat([a, torch.zeros(D - REAL)])) / t.view(-1, 1, 1), None

    config = FlowSamplerConfig(denoise_steps=k_steps, stochastic_steps="all", noise_level=0.5)
    out = sample(config, exact, torch.randn(batch, H, D, generator=torch.Generator().manual_seed(0)), MASK,
                 generator=torch.Generator().manual_seed(1))
    for t in (0.6, 0.4, 0.2):
        x = states[t]
        torch.testing.assert_close(x.mean(0), (1 - t) * a, atol=0.03, rtol=0)
        torch.testing.assert_close(x.std(0), torch.full((REAL,), t), atol=0.02, rtol=0)
    end = out.actions[:, 0, :REAL]
    torch.testing.assert_close(end.mean(0), a, atol=0.01, rtol=0)
    assert (end.std(0) < 0.01).all()


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
@pytest.mark.parametrize("stochastic_steps", ["one", "all"])
@pytest.mark.parametrize("k_steps", [1, 2, 5, 10])
def test_training_recomputes_the_recorded_log_probs_from_the_chains(method, stochastic_steps, k_steps):
    batch = 16
    expert = ToyExpert(batch)
    config = FlowSamplerConfig(denoise_steps=k_steps, noise_method=method, stochastic_steps=stochastic_steps)
    with torch.no_grad():
        out = sample(config, expert, torch.randn(batch, H, D), MASK, generator=torch.Generator().manual_seed(2))
    assert out.chain.shape == (batch, k_steps + 1, H, D) and out.stochastic.shape == (batch, k_steps)
    assert out.stochastic.sum(1).tolist() == [1 if stochastic_steps == "one" else k_steps] * batch
    recomputed = chain_log_prob(config, expert, out.chain, out.stochastic, MASK)
    torch.testing.assert_close(recomputed, out.log_prob, atol=1e-4, rtol=0)
    assert (out.log_prob[..., REAL:] == 0).all() and (out.log_prob[..., :REAL] != 0).all()
    # It is a function of the weights: a gradient reaches them.
    recomputed.sum().backward()
    assert expert.net[0].weight.grad.abs().sum() > 0


def test_one_stochastic_step_is_drawn_over_every_step():
    config = FlowSamplerConfig(denoise_steps=5)
    out = sample(config, ToyExpert(500), torch.randn(500, H, D), MASK, generator=torch.Generator().manual_seed(3))
    counts = out.stochastic.sum(0)
    assert (counts > 60).all(), counts  # about 100 each


def test_the_deterministic_sampler_is_the_ode_with_no_log_prob():
    expert = ToyExpert(4)
    noise = torch.randn(4, H, D)
    out = sample(FlowSamplerConfig(denoise_steps=5), expert, noise, MASK, deterministic=True)
    x = noise
    for step, t in enumerate(timesteps(5)[:-1]):
        v, _ = expert(x, torch.full((4,), float(t)), torch.arange(4))
        x = x - 0.2 * v
        torch.testing.assert_close(out.chain[:, step + 1], x)
    assert not out.stochastic.any() and (out.log_prob == 0).all()


def test_padded_dims_carry_noise_as_openpis_but_count_in_no_log_prob():
    """openpi keeps noise in every one of the model's action dims; the log-prob counts only
    the entries its mask keeps: the task's dims, and here the first two actions of three
    (the executed part of a chunk)."""
    expert = ToyExpert(8)
    executed = torch.zeros(H, D)
    executed[:2, :REAL] = 1
    out = sample(FlowSamplerConfig(stochastic_steps="all"), expert, torch.randn(8, H, D), executed,
                 generator=torch.Generator().manual_seed(4))
    assert (out.chain[:, 1:, :, REAL:] != 0).all()
    assert (out.log_prob[:, 2:] == 0).all() and (out.log_prob[..., REAL:] == 0).all()
    assert (out.log_prob[:, :2, :REAL] != 0).all()
    recomputed = chain_log_prob(FlowSamplerConfig(stochastic_steps="all"), expert, out.chain, out.stochastic, executed)
    torch.testing.assert_close(recomputed, out.log_prob, atol=1e-4, rtol=0)


@pytest.mark.parametrize("stochastic_steps", ["one", "all"])
def test_rlinfs_mean_reduction_averages_the_start_noise_and_the_stochastic_steps(stochastic_steps):
    expert = ToyExpert(6)
    summed, mean = (FlowSamplerConfig(denoise_steps=4, stochastic_steps=stochastic_steps, log_prob_reduction=r)
                    for r in ("sum", "mean"))
    noise = torch.randn(6, H, D)
    a = sample(summed, expert, noise, MASK, generator=torch.Generator().manual_seed(5))
    b = sample(mean, expert, noise, MASK, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a.chain, b.chain)
    start = torch.distributions.Normal(0.0, 1.0).log_prob(noise)
    terms = 1 + a.stochastic.sum(1).view(-1, 1, 1)
    torch.testing.assert_close(b.log_prob, (start + a.log_prob) / terms * MASK)
    recomputed = chain_log_prob(mean, expert, b.chain, b.stochastic, MASK)
    torch.testing.assert_close(recomputed, b.log_prob, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="log_prob_reduction"):
        FlowSamplerConfig(log_prob_reduction="max")


def test_the_gaussian_log_prob_is_torchs_and_zero_where_deterministic():
    x, mean, std = torch.randn(50), torch.randn(50), torch.rand(50) + 0.1
    torch.testing.assert_close(gaussian_log_prob(x, mean, std), torch.distributions.Normal(mean, std).log_prob(x))
    assert (gaussian_log_prob(x, mean, torch.zeros(50)) == 0).all()


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="noise_method"):
        FlowSamplerConfig(noise_method="ddpm")
    with pytest.raises(ValueError, match="stochastic_steps"):
        FlowSamplerConfig(stochastic_steps="some")
    with pytest.raises(ValueError, match="denoise_steps"):
        FlowSamplerConfig(denoise_steps=0)
    with pytest.raises(ValueError, match="flow_noise needs"):
        transition(FlowSamplerConfig(noise_method="flow_noise"), torch.zeros(1, H, D), torch.zeros(1, dtype=torch.long),
                   torch.zeros(1, H, D), None, torch.ones(1, dtype=torch.bool))


def test_chains_without_a_stochastic_step_score_zero_without_running_the_expert():
    def expert(x, t, rows):
        raise AssertionError("the expert ran on no rows")

    chain = torch.randn(3, 6, H, D)
    log_prob = chain_log_prob(FlowSamplerConfig(), expert, chain, torch.zeros(3, 5, dtype=torch.bool), MASK)
    assert log_prob.shape == (3, H, D) and (log_prob == 0).all()
