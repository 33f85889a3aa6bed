"""Real LIBERO (`make test` installs it with `make libero`): resets by reset_state_id, images, rewards."""

import functools
import os

import numpy as np
import pytest

from fleetrl.envs.libero.env import LiberoEnv, axis_angle, decode_language, encode_language

# The real simulator, one process: seconds per reset.
pytestmark = [pytest.mark.slow, pytest.mark.file_fixture, pytest.mark.libero]


@pytest.fixture(scope="module")
def env(tmp_path_factory, monkeypatch_module):
    # fleetrl writes LIBERO's config itself: no prompt, even with no config anywhere yet.
    monkeypatch_module.setenv("LIBERO_CONFIG_PATH", str(tmp_path_factory.mktemp("libero-config")))
    env = LiberoEnv("libero_10", task_ids=(0, 1), image_size=64, num_wait_steps=2, max_episode_steps=3)
    yield env
    env.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_reset_state_id_picks_the_task_and_its_init_state(env):
    assert env.reset_states.counts == [50, 50]
    obs, info = env.reset(options={"reset_state_id": 57})
    assert info == {"task_id": 1, "reset_state_id": 57}
    assert env.observation_space.contains(obs)
    assert obs["task_id"] == 1 and decode_language(obs["language"]) == env.suite.get_task(1).language
    first = env.reset(options={"reset_state_id": 7})[0]
    again = env.reset(options={"reset_state_id": 7})[0]
    np.testing.assert_allclose(first["state"], again["state"], atol=1e-3)  # the same init state


def test_images_have_their_size_and_content(env):
    obs, _ = env.reset(options={"reset_state_id": 0})
    for key in ("main_image", "wrist_image"):
        assert obs[key].shape == (64, 64, 3) and obs[key].dtype == np.uint8
        assert obs[key].std() > 5  # a scene, not a blank frame
    assert not np.array_equal(obs["main_image"], obs["wrist_image"])


def test_images_are_turned_upright():
    """LIBERO renders upside down; the env rotates by 180 degrees."""
    raw_image = np.zeros((4, 4, 3), np.uint8)
    raw_image[0, 0] = 255  # top left
    raw = {"agentview_image": raw_image, "robot0_eye_in_hand_image": raw_image, "robot0_eef_pos": np.zeros(3),
           "robot0_eef_quat": np.array([0.0, 0.0, 0.0, 1.0]), "robot0_gripper_qpos": np.zeros(2)}
    observe = LiberoEnv._observe.__get__(type("Fake", (), {"language": "pick", "task": 0})())
    obs = observe(raw)
    assert obs["main_image"][3, 3].tolist() == [255, 255, 255] and obs["main_image"][0, 0].tolist() == [0, 0, 0]


def test_the_step_cap_truncates_an_unsolved_episode(env):
    env.reset(options={"reset_state_id": 3})
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(np.zeros(7, np.float32))
        assert reward == 0.0 and not terminated and info["success_once"] is False
    assert truncated


def test_state_and_language_encodings():
    np.testing.assert_allclose(axis_angle(np.array([0.0, 0.0, np.sin(0.5), np.cos(0.5)])), [0, 0, 1.0], atol=1e-6)
    assert decode_language(encode_language("open the drawer")) == "open the drawer"
    with pytest.raises(ValueError, match="unknown LIBERO suite 'libero_11'"):
        LiberoEnv("libero_11")


def test_eval_options_pick_a_task_and_trial(env):
    _, info = env.reset(options={"task_index": 1, "trial": 7})
    assert info == {"task_id": 1, "reset_state_id": 57}


def test_same_step_autoreset_returns_the_finished_episode_with_a_mask(monkeypatch_module):
    """Two envs capped at 2 and 3 steps: each finishes on its own step, and only its final
    observation and info (with the episode's metrics) come back, marked in the mask."""
    from fleetrl.actor.episode_tracker import env_info
    from fleetrl.envs.vector import make_vector_env

    caps = iter([2, 3])
    envs = make_vector_env(lambda: LiberoEnv("libero_10", task_ids=(0,), image_size=32, num_wait_steps=1,
                                             max_episode_steps=next(caps), step_penalty=0.25),
                           num_envs=2, autoreset_mode="same_step")
    try:
        envs.reset(seed=[0, 1])
        finished = []
        for _ in range(3):
            obs, reward, terminated, truncated, info = envs.step(np.zeros((2, 7), np.float32))
            mask = info.get("_final_obs", np.zeros(2, bool))
            assert mask.tolist() == (terminated | truncated).tolist()
            finished.append(mask.tolist())
            for i in np.flatnonzero(mask):
                final = info["final_info"]
                assert final["_episode_len"][i] and final["episode_len"][i] == [2, 3][i]
                assert final["return"][i] == pytest.approx(-0.25 * [2, 3][i])
                assert not final["success_once"][i]
                assert info["final_obs"][i]["main_image"].shape == (32, 32, 3)
                # The env already started its next episode: this step's info is that reset's.
                assert info["_reset_state_id"][i] and "episode_len" not in env_info(info, int(i))
        assert finished == [[False, False], [True, False], [False, True]]
    finally:
        envs.close()


def test_the_members_of_a_group_share_each_reset_state(monkeypatch_module):
    """GRPO's groups, through the actor's own vector env with each env in a subprocess (as an
    actor runs LIBERO): 1-step episodes, so every second step starts new ones, and the two
    members of the group draw the same id every time."""
    from fleetrl.envs.vector import make_vector_env

    make_env = functools.partial(LiberoEnv, "libero_10", task_ids=(0, 1), image_size=32, num_wait_steps=0,
                                 max_episode_steps=1)
    envs = make_vector_env(make_env, num_envs=2, asynchronous=True, group_size=2, seed=5)
    try:
        assert len(set(envs.env_pids()) | {os.getpid()}) == 3
        _, info = envs.reset(seed=[0, 1])
        ids = [info["reset_state_id"].tolist()]
        for step in range(4):
            _, _, _, truncated, info = envs.step(np.zeros((2, 7), np.float32))
            if step % 2:  # next-step autoreset: every second step is a reset
                ids.append(info["reset_state_id"].tolist())
            else:
                assert truncated.all()
        assert all(a == b for a, b in ids), ids
        assert len({a for a, _ in ids}) > 1, ids  # and a new one each episode
    finally:
        envs.close()


def test_episodes_per_task_keeps_a_task_for_that_many_episodes(monkeypatch_module):
    env = LiberoEnv("libero_spatial", task_ids=(0, 1, 2), image_size=32, num_wait_steps=0, max_episode_steps=1,
                    episodes_per_task=3)
    try:
        infos = [env.reset(seed=4)[1]] + [env.reset()[1] for _ in range(8)]  # seeded once, then drawing on
        tasks = [info["task_id"] for info in infos]
        assert [len(set(tasks[i:i + 3])) for i in (0, 3, 6)] == [1, 1, 1], tasks  # blocks of three
        assert len({info["reset_state_id"] for info in infos}) > 3  # the init state is drawn every time
    finally:
        env.close()


def test_libero_prints_its_notices_once_per_process(tmp_path):
    """robosuite's macro warnings used to print twice (its handler and absl's) and LIBERO's
    "[info] using task orders" once per env built (four times per command)."""
    import subprocess
    import sys

    script = ("from absl import logging\nlogging.use_absl_handler()\n"
              "from fleetrl.envs.libero.env import LiberoEnv\n"
              "for _ in range(3):\n    env = LiberoEnv('libero_spatial', task_ids=(0,), image_size=16)\n"
              "env.reset(options={'task_index': 0, 'trial': 0})\nenv.close()\n")  # robosuite imported
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "LIBERO_CONFIG_PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert output.count("using task orders") == 1, output
    assert output.count("No private macro file found") == 1, output
