"""Action chunks: the env wrapper that plays them, and their rewards and log-probs in the losses."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.envs.action_chunks import ActionChunks
from fleetrl.losses.algorithms import PPO, VTrace
from fleetrl.losses.batch import UnrollBatch
from fleetrl.losses.chunks import action_level_gae, align_advantages, executed_mask, loss_mask, reduce_log_probs
from fleetrl.losses.config import LossConfig
from fleetrl.losses.gae import gae
from fleetrl.problems import load_problem


class Counter(gym.Env):
    """Reward = the step's number (1, 2, ...); terminates after `length` steps; records its actions."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, length=5):
        self.length, self.actions = length, []

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.actions.append(action)
        self.t += 1
        return np.full(1, self.t, np.float32), float(self.t), self.t == self.length, False, {}


def test_a_chunk_runs_its_actions_in_order_and_stops_at_the_episode_end():
    env = ActionChunks(Counter(length=5), chunk_size=3)
    assert env.action_space == gym.spaces.MultiDiscrete([3, 3, 3])
    env.reset()
    obs, reward, terminated, _, info = env.step(np.array([2, 0, 1]))
    assert env.unwrapped.actions == [2, 0, 1] and obs[0] == 3 and not terminated
    assert reward == 1 + 2 + 3 and info["action_rewards"].tolist() == [1, 2, 3] and info["actions_executed"] == 3
    obs, reward, terminated, _, info = env.step(np.array([1, 1, 2]))
    assert env.unwrapped.actions == [2, 0, 1, 1, 1]  # the chunk's last action never ran
    assert terminated and obs[0] == 5 and reward == 9
    assert info["action_rewards"].tolist() == [4, 5, 0] and info["actions_executed"] == 2


def test_a_time_limit_also_ends_a_chunk_early():
    env = ActionChunks(gym.wrappers.TimeLimit(Counter(length=100), max_episode_steps=4), chunk_size=3)
    env.reset()
    env.step(np.zeros(3, np.int64))
    _, reward, terminated, truncated, info = env.step(np.zeros(3, np.int64))
    assert truncated and not terminated and info["actions_executed"] == 1 and reward == 4


def test_box_actions_chunk_into_a_stacked_box_and_wrong_chunks_are_refused():
    env = ActionChunks(gym.make("Pendulum-v1"), chunk_size=4)
    assert env.action_space.shape == (4, 1) and np.all(env.action_space.high == 2.0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="expected a chunk of 4 actions, got shape"):
        env.step(np.zeros((3, 1), np.float32))


def test_the_actor_env_of_a_chunked_problem_and_its_specs():
    problem = load_problem("pendulum", {"chunk_size": "3"})
    assert [(s.name, s.shape) for s in problem.action_specs()] == [("action", (3, 1))]
    # Each step's per-action rewards and actions run travel as extras.
    assert [(s.name, s.dtype, s.shape, s.high) for s in problem.extra_specs()] == [
        ("action_rewards", np.float32, (3,), None), ("actions_executed", np.int64, (), 3)]
    assert load_problem("pendulum", {}).extra_specs() == ()
    assert isinstance(problem.make_actor_env(), ActionChunks)
    assert not isinstance(load_problem("pendulum", {}).make_actor_env(), ActionChunks)


# ----- reductions -----

T, B, K, D = 4, 3, 5, 2


def test_log_probs_reduce_to_chunks_actions_or_tokens():
    tokens = torch.randn(T, B, K, D)
    executed = torch.randint(1, K + 1, (T, B))
    mask = executed_mask(executed, K)
    assert mask.shape == (T, B, K) and mask.sum() == executed.sum()
    assert torch.equal(reduce_log_probs(tokens, mask, "token_level"), tokens)
    per_action = reduce_log_probs(tokens, mask, "action_level")
    assert per_action.shape == (T, B, K)
    torch.testing.assert_close(per_action, tokens[..., 0] + tokens[..., 1])
    per_chunk = reduce_log_probs(tokens, mask, "chunk_level")
    assert per_chunk.shape == (T, B)
    for t in range(T):
        for b in range(B):
            torch.testing.assert_close(per_chunk[t, b], tokens[t, b, :executed[t, b]].sum())
    # One categorical per action (no token dimension): action and token level agree.
    categorical = torch.randn(T, B, K)
    assert torch.equal(reduce_log_probs(categorical, mask, "action_level"), categorical)
    with pytest.raises(ValueError, match="unknown logprob_type 'step_level'"):
        reduce_log_probs(tokens, mask, "step_level")


def test_advantages_and_masks_broadcast_to_the_log_probs():
    valid = torch.tensor([[1.0, 0.0, 1.0]]).expand(T, B)
    mask = executed_mask(torch.tensor([[5, 5, 2]]).expand(T, B), K)
    chunk_adv, action_adv = torch.randn(T, B), torch.randn(T, B, K)
    assert torch.equal(align_advantages(chunk_adv, torch.Size([T, B, K, D]))[:, :, 3, 1], chunk_adv)
    assert torch.equal(align_advantages(action_adv, torch.Size([T, B, K, D]))[..., 1], action_adv)
    assert torch.equal(align_advantages(action_adv, torch.Size([T, B])), action_adv[..., 0])
    token_mask = loss_mask(valid, mask, torch.Size([T, B, K, D]))
    assert token_mask.shape == (T, B, K, D)
    assert token_mask[:, 0].sum() == T * K * D and token_mask[:, 1].sum() == 0 and token_mask[:, 2].sum() == T * 2 * D
    assert torch.equal(loss_mask(valid, mask, torch.Size([T, B])), valid)


# ----- action-level GAE -----

def consistent_episode_ends(rng, steps, batch, chunk):
    """Flags for steps 0..steps and, per transition, how many actions ran: a chunk stops
    early only where the episode ended, and the reset transition after an end runs none."""
    ends = rng.uniform(size=(steps + 1, batch))
    terminated, truncated = ends < 0.15, (ends >= 0.15) & (ends < 0.25)
    ended = terminated | truncated
    executed = np.where(ended[1:], rng.integers(1, chunk + 1, size=(steps, batch)), chunk)
    executed[ended[:-1]] = 0
    return terminated, truncated, executed


def naive_action_level_gae(rewards, executed, terminated_next, valid, values, bootstrap, gamma, lam):
    """Walks each env's actions backwards, one at a time."""
    steps, batch, chunk = rewards.shape
    out = np.zeros((steps, batch, chunk))
    for b in range(batch):
        following = 0.0  # the advantage of the next action in time
        for t in reversed(range(steps)):
            if not valid[t, b]:
                following = 0.0
                continue
            next_chunk_value = values[t + 1, b] if t + 1 < steps else bootstrap[b]
            for k in reversed(range(executed[t, b])):
                last = k == executed[t, b] - 1
                discount = gamma * (not terminated_next[t, b]) if last else gamma
                next_value = next_chunk_value if last else values[t, b]
                delta = rewards[t, b, k] + discount * next_value - values[t, b]
                following = delta + discount * lam * following
                out[t, b, k] = following
    return out


def test_action_level_gae_matches_a_naive_walk_over_actions():
    rng = np.random.default_rng(0)
    steps, batch, chunk, gamma, lam = 10, 6, 4, 0.97, 0.9
    terminated, truncated, executed = consistent_episode_ends(rng, steps, batch, chunk)
    rewards = rng.normal(size=(steps, batch, chunk)) * (np.arange(chunk) < executed[..., None])
    values, bootstrap = rng.normal(size=(steps, batch)), rng.normal(size=batch)
    valid = ~(terminated | truncated)[:-1]
    discounts = gamma * ~terminated[1:]
    got = action_level_gae(torch.tensor(rewards), torch.tensor(executed), torch.tensor(discounts),
                           torch.tensor(values), torch.tensor(bootstrap), torch.tensor(valid, dtype=torch.float64),
                           gamma, lam)
    want = naive_action_level_gae(rewards, executed, terminated[1:], valid, values, bootstrap, gamma, lam)
    assert got.advantages.shape == (steps, batch, chunk)
    np.testing.assert_allclose(got.advantages.numpy(), want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.returns.numpy(), want + values[..., None], rtol=1e-10)


def test_action_level_gae_of_one_action_chunks_is_plain_gae():
    rng = np.random.default_rng(1)
    steps, batch = 8, 5
    terminated, truncated, executed = consistent_episode_ends(rng, steps, batch, 1)
    rewards, values = rng.normal(size=(steps, batch)), rng.normal(size=(steps, batch))
    bootstrap = rng.normal(size=batch)
    valid = torch.tensor(~(terminated | truncated)[:-1], dtype=torch.float64)
    discounts = torch.tensor(0.9 * ~terminated[1:])
    plain = gae(torch.tensor(rewards), discounts, torch.tensor(values), torch.tensor(bootstrap), 0.8, valid)
    chunked = action_level_gae(torch.tensor(rewards)[..., None], torch.tensor(executed), discounts,
                               torch.tensor(values), torch.tensor(bootstrap), valid, 0.9, 0.8)
    torch.testing.assert_close(chunked.advantages[..., 0] * valid, plain.advantages * valid)


def test_with_lambda_one_a_chunks_first_action_carries_its_k_step_advantage():
    """Hand-computed: one transition, a full chunk of 3 rewards, then a truncation or a termination."""
    rewards = torch.tensor([[[1.0, 2.0, 3.0]]])
    values, bootstrap, gamma = torch.tensor([[10.0]]), torch.tensor([20.0]), 0.5
    for terminated, tail in ((False, 0.5 ** 3 * 20.0), (True, 0.0)):
        discounts = torch.tensor([[0.0 if terminated else gamma]])
        out = action_level_gae(rewards, torch.tensor([[3]]), discounts, values, bootstrap, torch.ones(1, 1), gamma, 1.0)
        assert out.advantages[0, 0, 0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 3 + tail - 10.0)
        # The last action: its own reward, then the next chunk's value (or nothing).
        assert out.advantages[0, 0, 2].item() == pytest.approx(3 + (0.5 * 20.0 if not terminated else 0.0) - 10.0)


# ----- the algorithms, wired -----

def chunked_batch(steps=6, batch=4, chunk=3, seed=0) -> UnrollBatch:
    rng = np.random.default_rng(seed)
    terminated, truncated, executed = consistent_episode_ends(rng, steps, batch, chunk)
    action_rewards = rng.normal(size=(steps + 1, batch, chunk)).astype(np.float32)
    executed = np.concatenate([np.zeros((1, batch), np.int64), executed])
    action_rewards *= np.arange(chunk) < executed[..., None]
    t = lambda x, dtype=torch.float32: torch.tensor(np.asarray(x), dtype=dtype)  # noqa: E731
    return UnrollBatch(
        observation={}, action={"action": torch.zeros(steps + 1, batch, chunk, dtype=torch.int64)},
        extras={"action_rewards": t(action_rewards), "actions_executed": t(executed, torch.int64)},
        first=torch.zeros(steps + 1, batch, dtype=torch.bool), reward=t(action_rewards.sum(-1)),
        terminated=t(terminated, torch.bool), truncated=t(truncated, torch.bool),
        behaviour_log_prob=torch.randn(steps + 1, batch, chunk, 2), behaviour_value=torch.randn(steps + 1, batch),
        policy_version=torch.zeros(steps + 1, batch, dtype=torch.int64), initial_state=(),
    )


class TokenProblem:
    """Just enough of a Problem: per-token log-probs that are a leaf tensor, to read gradients off."""

    def __init__(self, tokens, **config):
        self.tokens = tokens
        self.config = dataclasses.replace(LossConfig(algorithm="ppo"), **config)

    def action_log_prob(self, outputs, actions):
        return self.tokens

    def entropy(self, outputs):
        return torch.zeros_like(self.tokens)


@pytest.mark.parametrize("reward_type", ["chunk_level", "action_level"])
@pytest.mark.parametrize("logprob_type", ["chunk_level", "action_level", "token_level"])
def test_ppo_trains_only_on_actions_that_ran(reward_type, logprob_type):
    batch = chunked_batch()
    tokens = (batch.behaviour_log_prob + 0.1 * torch.randn_like(batch.behaviour_log_prob)).requires_grad_()
    problem = TokenProblem(tokens, reward_type=reward_type, logprob_type=logprob_type)
    outputs = {"baseline": torch.randn(batch.first.shape, requires_grad=True)}
    algorithm = PPO()
    prepared = algorithm.prepare(problem, batch)
    advantage_shape = (6, 4, 3) if reward_type == "action_level" else (6, 4)
    assert prepared["advantages"].shape == advantage_shape
    result = algorithm.rl_loss(problem, outputs, batch, prepared)
    loss, logs = result.loss, result.logs
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in logs.values())
    loss.backward()
    ran = executed_mask(batch.extras["actions_executed"][1:], 3)[..., None] * prepared["valid"][..., None, None]
    grad = tokens.grad[:-1]
    assert torch.all(grad[ran.expand_as(grad) == 0] == 0), "an action that never ran got a gradient"
    assert grad[ran.expand_as(grad) == 1].abs().sum() > 0
    assert torch.all(tokens.grad[-1] == 0)  # the bootstrap step's chunk has not run yet


def test_vtrace_refuses_action_level_chunks_with_a_clear_error():
    batch = chunked_batch()
    problem = TokenProblem(batch.behaviour_log_prob, reward_type="action_level")
    with pytest.raises(ValueError, match="vtrace takes one reward and one log-prob per step"):
        VTrace().prepare(problem, batch)
    with pytest.raises(ValueError, match="unknown logprob_type 'chunk'"):
        TokenProblem(batch.behaviour_log_prob, logprob_type="chunk")


def test_chunked_vtrace_sums_each_chunks_log_probs_over_the_actions_that_ran():
    batch = chunked_batch()
    tokens = batch.behaviour_log_prob.clone().requires_grad_()
    problem = TokenProblem(tokens, algorithm="vtrace")
    outputs = {"baseline": torch.randn(batch.first.shape, requires_grad=True)}
    algorithm = VTrace()
    algorithm.rl_loss(problem, outputs, batch, algorithm.prepare(problem, batch)).loss.backward()
    ran = executed_mask(batch.extras["actions_executed"][1:], 3)[..., None].expand(-1, -1, -1, 2)
    assert torch.all(tokens.grad[:-1][ran == 0] == 0) and tokens.grad[:-1][ran == 1].abs().sum() > 0

