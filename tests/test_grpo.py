"""GRPO: grouped resets on the actor, group-normalized episode returns on the learner."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.envs.vector import make_vector_env
from fleetrl.losses.batch import Unroll
from fleetrl.losses.group_advantages import GroupAdvantages

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


def unroll_for(slot, index, first, reward, ended):
    """An unroll of T+1 steps of `slot`, as the state store emits them (index 0: its first)."""
    return Unroll(slot=slot, run_id=1, index=index, initial_state=(), steps={
        "first": torch.tensor(first), "reward": torch.tensor(reward, dtype=torch.float32),
        "terminated": torch.tensor(ended), "truncated": torch.zeros(T + 1, dtype=torch.bool)})


def test_returns_are_normalized_within_the_group_and_unrolls_wait_for_them():
    hook = GroupAdvantages(group_size=2)
    slots = np.array([10, 11, 12, 13])  # groups (10, 11) and (12, 13)
    hook.actor_joined(slots)
    # Slot 10's first unroll covers episode 0 only; it must wait for its group.
    assert hook.process(unroll_for(10, 0, [True, False, False, False], [0, 1, 0, 0], [False] * 4)) == []
    # Slot 10's episode ends with return 1 + 1 = 2, and episode 1 starts; slot 11 is still playing.
    assert hook.process(unroll_for(10, 1, [False, False, True, False], [0, 1, 0, 0], [False, True, False, False])) == []
    # Slot 11 ends with return 3 + 5 = 8: both of slot 10's unrolls and this one are released.
    released = hook.process(unroll_for(11, 0, [True, False, False, False], [0, 3, 5, 0], [False, False, True, False]))
    assert [(u.slot, u.index) for u in released] == [(10, 0), (11, 0)]  # (10, 1) waits for episode 1
    expected = (2.0 - 5.0) / (3.0 + 1e-6)  # mean 5, population std 3
    assert released[0].extras["group_advantage"].tolist() == pytest.approx([expected] * 4)
    assert released[1].extras["group_advantage"].tolist()[:3] == pytest.approx([-expected] * 3)
    # Slot 10's second unroll, holding the start of episode 1, waits for that episode's score.
    assert hook.process(unroll_for(10, 2, [False] * 4, [0] * 4, [False] * 4)) == []
    # The other group ties: both advantages are zero.
    assert hook.process(unroll_for(12, 0, [True, False, False, False], [0, 2, 0, 0], [False, False, False, True])) == []
    tied = hook.process(unroll_for(13, 0, [True, False, False, False], [0, 0, 2, 0], [False, False, False, True]))
    assert [u.slot for u in tied] == [12, 13]
    assert all(u.extras["group_advantage"].tolist() == [0.0] * 4 for u in tied)


def test_waiting_unrolls_are_bounded_and_a_stalled_groups_are_dropped_with_a_log_line(caplog):
    hook = GroupAdvantages(group_size=2, max_waiting_unrolls=3)
    hook.actor_joined(np.array([0, 1, 2, 3]))  # groups (0, 1) and (2, 3); slots 1 and 3 never send
    playing = [False] * (T + 1)
    assert hook.process(unroll_for(0, 0, [True] + playing[1:], [0] * 4, playing)) == []
    assert hook.process(unroll_for(2, 0, [True] + playing[1:], [0] * 4, playing)) == []
    assert hook.process(unroll_for(0, 1, playing, [0] * 4, playing)) == []
    assert hook.dropped_unrolls == 0
    with caplog.at_level("WARNING"):
        assert hook.process(unroll_for(2, 1, playing, [0] * 4, playing)) == []  # a 4th: group (0, 1) goes
    assert hook.dropped_unrolls == 2 and [u.slot for u, _, _ in hook._waiting] == [2, 2]
    assert "GRPO: dropped 2 unrolls of group 0" in caplog.text and "max_waiting_unrolls=3" in caplog.text


def test_a_leaving_actor_drops_its_waiting_unrolls():
    hook = GroupAdvantages(group_size=2)
    slots = np.array([0, 1])
    hook.actor_joined(slots)
    hook.process(unroll_for(0, 0, [True, False, False, False], [0, 1, 1, 1], [False] * 4))
    hook.actor_left(slots)
    assert hook.dropped_unrolls == 1
    assert hook.process(unroll_for(0, 1, [False] * 4, [1] * 4, [False] * 4)) == []  # late: its actor has left
    assert hook.dropped_unrolls == 2


def test_grpo_refuses_groups_of_one_and_actors_whose_envs_split_a_group():
    with pytest.raises(ValueError, match="GRPO needs groups of at least 2 envs"):
        GroupAdvantages(group_size=1)
    hook = GroupAdvantages(group_size=4)
    assert hook.admit(8) is None and "not a multiple of group_size 4" in hook.admit(6)
