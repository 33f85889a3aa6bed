"""V-trace against the naive O(T^2) formula, the reference check value, and episode ends."""

import numpy as np
import pytest
import torch

from fleetrl.losses.config import LossConfig
from fleetrl.losses.transitions import transitions
from fleetrl.losses.vtrace import vtrace_loss, vtrace_returns


def naive_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, pg_rho_bar, lambda_):
    """vs_s = V_s + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t delta_t, written as loops."""
    rhos = np.exp(log_rhos)
    clipped = np.minimum(rho_bar, rhos)
    cs = lambda_ * np.minimum(c_bar, rhos)
    num_steps = len(values)
    values_ext = np.concatenate([values, bootstrap[None]], 0)
    vs = np.zeros_like(values)
    for s in range(num_steps):
        total = values[s].copy()
        for t in range(s, num_steps):
            product = np.ones_like(values[0])
            for i in range(s, t):
                product = product * discounts[i] * cs[i]
            delta = clipped[t] * (rewards[t] + discounts[t] * values_ext[t + 1] - values[t])
            total = total + product * delta
        vs[s] = total
    vs_ext = np.concatenate([vs, bootstrap[None]], 0)
    pg_adv = np.minimum(pg_rho_bar, rhos) * (rewards + discounts * vs_ext[1:] - values)
    return vs, pg_adv


@pytest.mark.parametrize("rho_bar,c_bar,pg_rho_bar,lambda_", [
    (1.0, 1.0, 1.0, 1.0), (3.7, 1.5, 2.2, 1.0), (1.0, 1.0, 1.0, 0.9), (float("inf"), float("inf"), float("inf"), 1.0),
])
def test_matches_naive_formula(rho_bar, c_bar, pg_rho_bar, lambda_):
    rng = np.random.default_rng(0)
    num_steps, batch = 7, 5
    log_rhos = rng.normal(0, 1, (num_steps, batch))
    discounts = rng.uniform(0, 1, (num_steps, batch)) * (rng.uniform(size=(num_steps, batch)) > 0.2)
    rewards = rng.normal(0, 1, (num_steps, batch))
    values = rng.normal(0, 1, (num_steps, batch))
    bootstrap = rng.normal(0, 1, batch)
    got = vtrace_returns(*(torch.tensor(x) for x in (log_rhos, discounts, rewards, values, bootstrap)),
                         rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lambda_=lambda_)
    vs, pg_adv = naive_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, pg_rho_bar, lambda_)
    np.testing.assert_allclose(got.vs.numpy(), vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages.numpy(), pg_adv, rtol=1e-10, atol=1e-10)


def test_reference_check_value():
    t = torch.arange(5, dtype=torch.float64)
    got = vtrace_returns(
        log_rhos=(5 * (t / 5 - 0.5))[:, None], discounts=torch.full((5, 1), 0.9, dtype=torch.float64),
        rewards=t[:, None], values=t[:, None], bootstrap_value=torch.ones(1, dtype=torch.float64),
        rho_bar=3.7, pg_rho_bar=2.2,
    )
    np.testing.assert_allclose(got.vs[:, 0].numpy(), [0.200182, 2.709682, 8.513628, 11.932397, 7.33], atol=1e-6)
    np.testing.assert_allclose(got.pg_advantages[:, 0].numpy(), [0.200182, 1.709682, 6.513628, 10.876614, 1.98],
                               atol=1e-6)


def test_on_policy_without_clipping_is_n_step_return():
    # With rho = 1 and lambda = 1, vs_t is the discounted n-step return bootstrapped at T.
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    got = vtrace_returns(torch.zeros(3, 1), torch.full((3, 1), 0.5), rewards, torch.tensor([[9.0], [9.0], [9.0]]),
                         torch.tensor([8.0]))
    assert got.vs[0, 0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 8)


def _episode_unroll(end_flag: str):
    """4 steps, one env: x0 -> x1 -> x2 (final, `end_flag`) -> x3 (reset of the next episode)."""
    reward = torch.tensor([[0.0], [1.0], [1.0], [0.0]])
    terminated = torch.zeros(4, 1, dtype=torch.bool)
    truncated = torch.zeros(4, 1, dtype=torch.bool)
    (terminated if end_flag == "terminated" else truncated)[2] = True
    return reward, terminated, truncated


@pytest.mark.parametrize("end_flag", ["terminated", "truncated"])
def test_episode_end(end_flag):
    gamma = 0.9
    reward, terminated, truncated = _episode_unroll(end_flag)
    steps = transitions(reward, terminated, truncated, gamma)
    # The final -> reset step is no transition of any episode.
    assert steps.valid[:, 0].tolist() == [1.0, 1.0, 0.0]
    values = torch.tensor([[0.5], [0.6], [0.7]])
    bootstrap = torch.tensor([0.8])
    got = vtrace_returns(torch.zeros(3, 1), steps.discounts, steps.rewards, values, bootstrap, valid=steps.valid)
    final_value = 0.7 if end_flag == "truncated" else 0.0  # truncation bootstraps from V(final observation)
    expected_v1 = 1.0 + gamma * final_value
    assert got.vs[1, 0].item() == pytest.approx(expected_v1)
    assert got.vs[0, 0].item() == pytest.approx(1.0 + gamma * expected_v1)
    # Nothing of the next episode (bootstrap 0.8) leaks back, and the masked step trains nothing.
    assert got.vs[2, 0].item() == pytest.approx(0.7)
    assert got.pg_advantages[2, 0].item() == 0.0
    assert got.pg_advantages[1, 0].item() == pytest.approx(expected_v1 - 0.6)


def test_loss_gradients_flow_to_policy_and_baseline_only_through_the_estimates():
    torch.manual_seed(0)
    logits = torch.randn(6, 3, 2, requires_grad=True)
    values = torch.randn(6, 3, requires_grad=True)
    dist = torch.distributions.Categorical(logits=logits)
    actions = dist.sample()
    loss, logs = vtrace_loss(
        target_log_probs=dist.log_prob(actions), entropy=dist.entropy(), values=values,
        behaviour_log_probs=dist.log_prob(actions).detach() + 0.1, rewards=torch.randn(5, 3),
        discounts=torch.full((5, 3), 0.99), valid=torch.ones(5, 3), config=LossConfig(),
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert logits.grad[:-1].abs().sum() > 0 and values.grad[:-1].abs().sum() > 0
    # The last step only bootstraps: targets carry no gradient into it.
    assert values.grad[-1].abs().sum() == 0 and logits.grad[-1].abs().sum() == 0
    assert set(logs) >= {"loss/total", "loss/policy", "loss/baseline", "policy/entropy", "value/explained_variance"}
