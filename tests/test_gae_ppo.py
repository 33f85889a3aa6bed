"""GAE against a naive per-episode loop, PPO's loss against hand-computed values, episode ends."""

import math

import numpy as np
import pytest
import torch

from fleetrl.losses.config import LossConfig
from fleetrl.losses.gae import gae
from fleetrl.losses.ppo import categorical_kl, ppo_loss
from fleetrl.losses.transitions import transitions


def naive_gae(reward, terminated, truncated, values, gamma, lam):
    """Per env, per transition: sum_k (gamma lam)^k delta_{t+k} until the episode's last transition."""
    num_steps = values.shape[0] - 1
    advantages = np.zeros((num_steps, values.shape[1]))
    for b in range(values.shape[1]):
        for t in range(num_steps):
            if terminated[t, b] or truncated[t, b]:
                continue  # x_t is a final observation: the step to the reset is no transition
            total, weight = 0.0, 1.0
            for k in range(t, num_steps):
                bootstrap = 0.0 if terminated[k + 1, b] else values[k + 1, b]
                total += weight * (reward[k + 1, b] + gamma * bootstrap - values[k, b])
                if terminated[k + 1, b] or truncated[k + 1, b]:
                    break
                weight *= gamma * lam
            advantages[t, b] = total
    return advantages


def test_gae_matches_the_naive_loop_with_episode_ends():
    rng = np.random.default_rng(0)
    steps, batch, gamma, lam = 12, 6, 0.97, 0.9
    reward = rng.normal(size=(steps + 1, batch))
    values = rng.normal(size=(steps + 1, batch))
    ends = rng.uniform(size=(steps + 1, batch))
    terminated, truncated = ends < 0.12, (ends >= 0.12) & (ends < 0.2)
    prep = transitions(torch.tensor(reward), torch.tensor(terminated), torch.tensor(truncated), gamma)
    got = gae(prep.rewards.double(), prep.discounts.double(), torch.tensor(values[:-1]), torch.tensor(values[-1]),
              lam, prep.valid.double())
    # transitions() hands out float32 rewards and discounts.
    np.testing.assert_allclose(got.advantages.numpy(), naive_gae(reward, terminated, truncated, values, gamma, lam),
                               atol=1e-5)
    np.testing.assert_allclose(got.returns.numpy(), got.advantages.numpy() + values[:-1], atol=1e-12)


@pytest.mark.parametrize("end_flag", ["terminated", "truncated"])
def test_gae_bootstraps_truncation_from_the_final_observation(end_flag):
    # x0 -> x1 -> x2 (final) -> x3 (reset): rewards 1, 1 on arriving at x1, x2.
    reward = torch.tensor([[0.0], [1.0], [1.0], [0.0]])
    flags = {"terminated": torch.zeros(4, 1, dtype=torch.bool), "truncated": torch.zeros(4, 1, dtype=torch.bool)}
    flags[end_flag][2] = True
    prep = transitions(reward, flags["terminated"], flags["truncated"], 0.9)
    values = torch.tensor([[0.5], [0.6], [0.7]])
    got = gae(prep.rewards, prep.discounts, values, torch.tensor([0.8]), 0.5, prep.valid)
    final_value = 0.7 if end_flag == "truncated" else 0.0
    a1 = 1.0 + 0.9 * final_value - 0.6
    a0 = 1.0 + 0.9 * 0.6 - 0.5 + 0.9 * 0.5 * a1
    assert got.advantages[:, 0].tolist() == pytest.approx([a0, a1, 0.0])


def ppo_inputs():
    t = lambda *v: torch.tensor([list(v)]).T  # noqa: E731  one env, [T, 1]
    return dict(
        log_probs=t(math.log(1.5), math.log(0.5), math.log(1.1)),
        old_log_probs=t(0.0, 0.0, 0.0),
        advantages=t(2.0, -1.0, 3.0),
        values=t(1.0, 4.0, 2.0),
        old_values=t(0.0, 3.0, 2.0),
        returns=t(2.0, 1.0, 2.5),
        entropy=t(0.5, 0.7, 0.9),
        valid=t(1.0, 1.0, 1.0),
    )


def test_ppo_loss_matches_hand_computed_values():
    config = LossConfig(clip_eps_low=0.2, clip_eps_high=0.3, normalize_advantages=False, baseline_cost=0.5,
                        entropy_cost=0.1)
    loss, logs = ppo_loss(**ppo_inputs(), config=config)
    # ratios 1.5, 0.5, 1.1; clipped to [0.8, 1.3]: 1.3, 0.8, 1.1
    # per step max(-A r, -A clip(r)): max(-3, -2.6) = -2.6; max(0.5, 0.8) = 0.8; -3.3
    policy = (-2.6 + 0.8 - 3.3) / 3
    value = 0.5 * ((2 - 1) ** 2 + (1 - 4) ** 2 + (2.5 - 2) ** 2) / 3
    entropy = (0.5 + 0.7 + 0.9) / 3
    assert logs["loss/policy"].item() == pytest.approx(policy)
    assert logs["loss/value"].item() == pytest.approx(value)
    assert loss.item() == pytest.approx(policy + 0.5 * value - 0.1 * entropy)
    assert logs["ppo/clip_fraction"].item() == pytest.approx(2 / 3)
    kl = ((1.5 - 1 - math.log(1.5)) + (0.5 - 1 - math.log(0.5)) + (1.1 - 1 - math.log(1.1))) / 3
    assert logs["ppo/approx_kl"].item() == pytest.approx(kl)
    assert logs["ppo/ratio_max"].item() == pytest.approx(1.5)
    masked = {**ppo_inputs(), "valid": torch.tensor([[0.0, 1.0, 1.0]]).T}  # the 1.5 step is masked out
    assert ppo_loss(**masked, config=config)[1]["ppo/ratio_max"].item() == pytest.approx(1.1)
    # The advantages' spread before any normalization: std of 2, -1, 3 over the batch.
    assert logs["policy/advantage_std"].item() == pytest.approx(math.sqrt(78 / 27))


def test_ppo_dual_clip_value_clip_and_huber():
    inputs = ppo_inputs()
    inputs["log_probs"][1] = math.log(5.0)  # a negative-advantage step whose ratio exploded
    plain, _ = ppo_loss(**inputs, config=LossConfig(normalize_advantages=False, entropy_cost=0.0, baseline_cost=0.0))
    dual, logs = ppo_loss(**inputs, config=LossConfig(normalize_advantages=False, entropy_cost=0.0,
                                                      baseline_cost=0.0, dual_clip=3.0))
    # Step 1's loss -A * r = 5 is capped at -3 * A = 3.
    assert (plain - dual).item() == pytest.approx((5.0 - 3.0) / 3)

    _, clipped = ppo_loss(**inputs, config=LossConfig(normalize_advantages=False, value_clip_eps=0.5))
    # V_clip = V_old + clip(V - V_old, +-0.5) = 0.5, 3.5, 2.0; errors max((R-V)^2, (R-V_clip)^2)
    assert clipped["loss/value"].item() == pytest.approx(0.5 * (max(1, 2.25) + max(9, 6.25) + max(0.25, 0.25)) / 3)

    _, huber = ppo_loss(**inputs, config=LossConfig(normalize_advantages=False, value_huber_delta=1.0))
    # Huber (times 2, to match squares near zero): 1 -> 1; 3 -> 2*(3 - 0.5) = 5; 0.5 -> 0.25
    assert huber["loss/value"].item() == pytest.approx(0.5 * (1 + 5 + 0.25) / 3)


def test_ppo_normalizes_advantages_over_valid_steps_only():
    inputs = ppo_inputs()
    inputs["valid"] = torch.tensor([[1.0], [1.0], [0.0]])
    inputs["log_probs"] = inputs["old_log_probs"].clone().requires_grad_()
    loss, _ = ppo_loss(**inputs, config=LossConfig(entropy_cost=0.0, baseline_cost=0.0))
    loss.backward()
    # At ratio 1 the gradient is -A_normalized / count: A = (2, -1) normalize to (1, -1).
    assert inputs["log_probs"].grad[:, 0].tolist() == pytest.approx([-0.5, 0.5, 0.0])


def test_categorical_kl_matches_the_naive_sum_and_sums_a_chunks_actions():
    torch.manual_seed(0)
    before, now = torch.randn(4, 3, 5), torch.randn(4, 3, 5)
    p, q = np.exp(before.double().numpy()), np.exp(now.double().numpy())
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    naive = (p * np.log(p / q)).sum(-1)  # sum_a p(a) log(p(a) / q(a))
    np.testing.assert_allclose(categorical_kl(before, now).numpy(), naive, rtol=1e-5, atol=1e-6)
    chunked_before, chunked_now = torch.randn(4, 3, 2, 5), torch.randn(4, 3, 2, 5)  # two actions per step
    torch.testing.assert_close(categorical_kl(chunked_before, chunked_now),
                               categorical_kl(chunked_before[:, :, 0], chunked_now[:, :, 0]) +
                               categorical_kl(chunked_before[:, :, 1], chunked_now[:, :, 1]))
    assert categorical_kl(before, before).abs().max() < 1e-6


def test_the_anchor_pulls_a_drifted_state_back_when_its_advantage_is_zero():
    """A state whose sampled action has advantage 0 gets no policy gradient; the anchor's
    gradient moves its logits back toward the policy before the batch."""
    config = LossConfig(algorithm="ppo", normalize_advantages=False, baseline_cost=0.0, entropy_cost=0.0,
                        anchor_kl_cost=3.0)
    anchor = torch.tensor([[[4.0, 0.0]]])  # [T=1, B=1, A=2]: the right action nearly always
    logits = torch.tensor([[[1.0, 0.0]]], requires_grad=True)  # drifted toward the other action
    log_probs = torch.log_softmax(logits, -1)[..., 0]
    zero = torch.zeros(1, 1)
    inputs = dict(log_probs=log_probs, old_log_probs=log_probs.detach(), advantages=zero, values=zero,
                  old_values=zero, returns=zero, entropy=zero, valid=torch.ones(1, 1))
    loss, logs = ppo_loss(**inputs, anchor_kl=categorical_kl(anchor, logits), config=config)
    loss.backward()
    kl = categorical_kl(anchor, logits.detach()).item()
    assert logs["ppo/anchor_kl"].item() == pytest.approx(kl) and kl > 0.1
    assert loss.item() == pytest.approx(3.0 * kl)  # the rest of the loss is 0 at advantage 0
    assert logits.grad[0, 0, 0] < 0 < logits.grad[0, 0, 1]  # descent raises the right action's logit
    without = ppo_loss(**{**inputs, "log_probs": torch.log_softmax(logits, -1)[..., 0]}, config=config)[0]
    assert without.item() == pytest.approx(0.0)


def test_anchor_kl_cost_is_checked_by_name():
    with pytest.raises(ValueError, match="anchor_kl_cost"):
        LossConfig(anchor_kl_cost=-1.0)
    with pytest.raises(ValueError, match="anchor_kl_cost applies to algorithm=ppo only"):
        LossConfig(algorithm="vtrace", anchor_kl_cost=1.0)
