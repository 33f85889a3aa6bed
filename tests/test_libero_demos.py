"""LIBERO's demonstration files replayed as an env: a tiny file in LIBERO's layout, written here."""

import numpy as np
import pytest

pytestmark = pytest.mark.libero
h5py = pytest.importorskip("h5py", reason="the libero extra (make libero puts it in)")

from fleetrl.envs.action_chunks import ActionChunks  # noqa: E402
from fleetrl.envs.libero.demo_replay import LiberoDemoReplay  # noqa: E402
from fleetrl.envs.libero.env import decode_language  # noqa: E402


def test_a_demonstration_replays_its_frames_state_and_next_actions(tmp_path, write_demo_file):
    path = write_demo_file(tmp_path / "demo.hdf5")
    env = LiberoDemoReplay([path], image_size=16, chunk_size=3)
    obs, info = env.reset(options={"demo_index": 0})
    assert env.observation_space.contains(obs)
    with h5py.File(path) as f:
        demo = f["data/demo_0"]
        actions = demo["actions"][:].astype(np.float32)
        np.testing.assert_array_equal(obs["main_image"], demo["obs/agentview_rgb"][0][::-1, ::-1])
        np.testing.assert_array_equal(obs["wrist_image"], demo["obs/eye_in_hand_rgb"][0][::-1, ::-1])
        state = np.concatenate([demo["obs/ee_pos"][2], demo["obs/ee_ori"][2], demo["obs/gripper_states"][2]])
    assert decode_language(obs["language"]) == "put the bowl on the plate"
    np.testing.assert_allclose(obs["oracle_action"], actions[:3], rtol=1e-6)
    for t in range(1, 7):
        obs, reward, terminated, truncated, info = env.step(np.zeros(7))  # the action is ignored
        if t == 2:
            np.testing.assert_allclose(obs["state"], state.astype(np.float32), rtol=1e-6)
        if terminated:
            break
    assert t == 6 and terminated and not truncated and info["success_once"] == 1.0
    np.testing.assert_allclose(obs["oracle_action"], actions[[6, 6, 6]], rtol=1e-6)  # the last one repeated


def test_in_chunks_each_agent_step_moves_one_chunk_along_the_demonstration(tmp_path, write_demo_file):
    path = write_demo_file(tmp_path / "demo.hdf5", lengths=(9,))
    env = ActionChunks(LiberoDemoReplay([path], image_size=8, chunk_size=4), 4)
    obs, _ = env.reset(options={"demo_index": 0})
    with h5py.File(path) as f:
        actions = f["data/demo_0/actions"][:].astype(np.float32)
    obs, _, terminated, _, info = env.step(obs["oracle_action"])
    np.testing.assert_allclose(obs["oracle_action"], actions[4:8], rtol=1e-6)
    obs, _, terminated, _, info = env.step(obs["oracle_action"])
    assert terminated and info["actions_executed"] == 4 and obs["main_image"].shape == (8, 8, 3)


def test_several_files_are_tasks_and_a_draw_covers_every_demonstration(tmp_path, write_demo_file):
    paths = [write_demo_file(tmp_path / "a.hdf5"), write_demo_file(tmp_path / "b.hdf5", instruction="")]
    env = LiberoDemoReplay(paths, image_size=16)
    assert env.num_demos == 4
    seen = {env.reset(seed=seed)[1]["demo_index"] for seed in range(40)}
    assert seen == {0, 1, 2, 3}
    obs, info = env.reset(options={"demo_index": 3})
    assert info["task_id"] == 1 and obs["task_id"] == 1
    assert decode_language(obs["language"]) == "b"  # no problem_info: the file's name


def test_a_missing_file_or_key_is_named(tmp_path, write_demo_file):
    with pytest.raises(ValueError, match="no file at"):
        LiberoDemoReplay([str(tmp_path / "none.hdf5")])
    broken = write_demo_file(tmp_path / "broken.hdf5", drop="eye_in_hand_rgb")
    with pytest.raises(ValueError, match="demo_0 lacks obs/eye_in_hand_rgb"):
        LiberoDemoReplay([broken])
    with pytest.raises(ValueError, match="no demonstration files"):
        LiberoDemoReplay([])
