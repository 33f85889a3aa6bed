"""LIBERO's global reset_state_id, both ways, and the config file fleetrl writes for LIBERO (no simulator needed)."""

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


@pytest.mark.libero
def test_fleetrl_rewrites_its_libero_config_for_the_install_in_use_but_never_a_users(tmp_path, monkeypatch):
    from fleetrl.envs.libero import config

    monkeypatch.delenv("LIBERO_CONFIG_PATH", raising=False)
    monkeypatch.setattr(config, "DEFAULT_CONFIG_DIR", str(tmp_path / "fleetrl"))
    stale = tmp_path / "fleetrl" / "config.yaml"
    stale.parent.mkdir()
    stale.write_text("benchmark_root: /gone/venv/libero/libero\n")  # written by another, deleted venv
    path = config.prepare_libero()
    assert path == str(stale) and "/gone/venv" not in stale.read_text()
    assert "benchmark_root: " in stale.read_text() and "bddl_files: " in stale.read_text()

    users = tmp_path / "mine" / "config.yaml"
    users.parent.mkdir()
    users.write_text("benchmark_root: /my/own/libero\n")
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(users.parent))
    assert config.prepare_libero() == str(users) and users.read_text() == "benchmark_root: /my/own/libero\n"
