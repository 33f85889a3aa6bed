"""GRPO: grouped resets on the actor, group-normalized episode returns on the learner."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.envs.vector import make_vector_env
from fleetrl.learner.group_scores import GroupScores

T = 3


def test_members_of_a_group_reset_identically_episode_after_episode():
    envs = make_vector_env(lambda: gym.make("CartPole-v1"), 6, group_size=3, seed=7)
    obs, _ = envs.reset(seed=[0, 1, 2, 3, 4, 5])
    assert np.array_equal(obs[0], obs[1]) and np.array_equal(obs[1], obs[2])
    assert not np.array_equal(obs[0], obs[3]) and np.array_equal(obs[3], obs[5])
    resets = {i: [] for i in range(6)}
    needs_reset = np.zeros(6, bool)
    rng = np.random.default_rng(0)
    for _ in range(300):
        obs, _, terminated, truncated, _ = envs.step(rng.integers(0, 2, 6))
        for i in np.flatnonzero(needs_reset):
            resets[i].append(obs[i].copy())  # the next-step autoreset's first observation
        needs_reset = terminated | truncated
    for a, b in [(0, 1), (0, 2), (3, 4)]:
        n = min(len(resets[a]), len(resets[b]))
        assert n >= 3 and all(np.array_equal(x, y) for x, y in zip(resets[a][:n], resets[b][:n]))
    with pytest.raises(ValueError, match="not a multiple of group_size 4"):
        make_vector_env(lambda: gym.make("CartPole-v1"), 6, group_size=4)


def unroll_for(slot, episodes, ended):
    """A minimal unroll of T+1 steps of `slot`, as the state store emits them."""
    return ({"slot": torch.full((T + 1,), slot), "episode_index": torch.tensor(episodes),
             "terminated": torch.tensor(ended), "truncated": torch.zeros(T + 1, dtype=torch.bool)}, ())


def test_returns_are_normalized_within_the_group_and_unrolls_wait_for_them():
    emitted = []
    scores = GroupScores(group_size=2, emit=lambda u: emitted.append(u) or True)
    slots = np.array([10, 11, 12, 13])  # groups (10, 11) and (12, 13)
    scores.add_actor(slots)
    yes, no = np.ones(4, bool), np.zeros(4, bool)
    scores.observe(slots, yes, np.zeros(4), no)  # episode 0 starts everywhere
    scores.observe(slots, no, np.array([1.0, 3.0, 2.0, 2.0]), no)
    # Slot 10's unroll covers episode 0 only; it must wait for its group.
    assert scores.hold(unroll_for(10, [0, 0, 0, 0], [False] * 4)) and emitted == []
    scores.observe(slots[:1], no[:1], np.array([1.0]), yes[:1])  # slot 10 ends with return 2
    assert emitted == []  # slot 11 is still playing
    scores.observe(slots[1:2], no[:1], np.array([5.0]), yes[:1])  # slot 11 ends with return 8
    assert len(emitted) == 1
    expected = (2.0 - 5.0) / (3.0 + 1e-6)  # mean 5, population std 3
    assert emitted[0][0]["group_advantage"].tolist() == pytest.approx([expected] * 4)
    # The other group ties: both advantages are zero.
    scores.observe(slots[2:], no[2:], np.zeros(2), yes[2:])
    assert scores.hold(unroll_for(12, [0, 0, 0, 0], [False] * 4))
    assert emitted[-1][0]["group_advantage"].tolist() == [0.0] * 4


def test_a_leaving_actor_drops_its_waiting_unrolls():
    scores = GroupScores(group_size=2, emit=lambda u: True)
    slots = np.array([0, 1])
    scores.add_actor(slots)
    scores.observe(slots, np.ones(2, bool), np.zeros(2), np.zeros(2, bool))
    scores.hold(unroll_for(0, [0, 0, 0, 0], [False] * 4))
    scores.remove_actor(slots)
    assert scores.dropped_unrolls == 1
