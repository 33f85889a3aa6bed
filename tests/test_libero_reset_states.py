"""LIBERO's global reset_state_id, both ways (no simulator needed)."""

import pytest

from fleetrl.envs.libero.reset_states import ResetStates


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
