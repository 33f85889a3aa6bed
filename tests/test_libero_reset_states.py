"""LIBERO's global reset_state_id, both ways, and how envs share and walk them (no simulator needed)."""

import numpy as np
import pytest

from fleetrl.envs.libero.reset_states import ResetSchedule, ResetStates


def test_ids_map_to_task_and_trial_and_back_through_cumulative_bins():
    states = ResetStates([3, 1, 4])
    assert len(states) == 8 and states.bins == [0, 3, 4, 8]
    pairs = [states.task_trial(i) for i in range(len(states))]
    assert pairs == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert [states.reset_state_id(t, k) for t, k in pairs] == list(range(8))
    for bad in (-1, 8):
        with pytest.raises(ValueError, match=f"reset_state_id {bad} is outside"):
            states.task_trial(bad)
    with pytest.raises(ValueError, match="no init state 1 of task 1"):
        states.reset_state_id(1, 1)


def test_groups_share_a_reset_state():
    schedule = ResetSchedule(ResetStates([50] * 10), num_envs=8, group_size=4, seed=3)
    for _ in range(5):
        ids = schedule.next_ids()
        assert len(set(ids[:4])) == 1 and len(set(ids[4:])) == 1
    with pytest.raises(ValueError, match="multiple of group_size"):
        ResetSchedule(ResetStates([5]), num_envs=6, group_size=4)


def test_ordered_sampling_visits_every_state_once_per_pass():
    states = ResetStates([2, 3])
    schedule = ResetSchedule(states, num_envs=2, ordered=True)
    visited = np.concatenate([schedule.next_ids() for _ in range(5)])
    assert visited.tolist() == [0, 1, 2, 3, 4] * 2


def test_random_sampling_is_seeded():
    a = ResetSchedule(ResetStates([50] * 10), num_envs=4, seed=1)
    b = ResetSchedule(ResetStates([50] * 10), num_envs=4, seed=1)
    assert all((a.next_ids() == b.next_ids()).all() for _ in range(3))
