"""The fast LIBERO env hands out what the slow one did, bit for bit, on the real simulator.

The reference renders every camera at every step and rebuilds the simulator at every reset
(LIBERO's defaults, and fleetrl's before its speed-ups). The env under test resets softly and
renders only the observations that leave it: a chunk's last, a reset's last settling step,
the step that truncates, and the final frame of a success that came inside a chunk.
"""

import numpy as np
import pytest

from fleetrl.envs.action_chunks import ActionChunks
from fleetrl.envs.libero.env import LiberoEnv

pytestmark = [pytest.mark.slow, pytest.mark.libero]

K = 5
CAP = 12  # truncation comes on the 3rd action of the 3rd chunk


@pytest.fixture(scope="module", autouse=True)
def libero_config(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LIBERO_CONFIG_PATH", str(tmp_path_factory.mktemp("libero-config")))
        yield


def settings(**overrides):
    return {"image_size": 64, "max_episode_steps": CAP, "num_wait_steps": 3, **overrides}


def reference(suite: str, tasks: tuple[int, ...]) -> LiberoEnv:
    return LiberoEnv(suite, tasks, **settings(soft_reset=False, render_every_step=True))


def assert_same(a: dict, b: dict, where) -> None:
    for key in a:
        assert np.array_equal(a[key], b[key]), (key, where)


def test_chunked_and_unchunked_soft_reset_observations_equal_rendering_every_step_with_rebuilds():
    """A task change each way, and a kept task; the env in chunks and the env stepped alone."""
    suite, tasks, resets = "libero_10", (0, 1), [(0, 0), (1, 2), (0, 3), (0, 1)]
    slow, fast = reference(suite, tasks), ActionChunks(LiberoEnv(suite, tasks, **settings()), K)
    unchunked = LiberoEnv(suite, tasks, **settings())
    rng = np.random.default_rng(0)
    try:
        for task_index, trial in resets:
            options = {"task_index": task_index, "trial": trial}
            expected, _ = slow.reset(seed=1, options=options)
            assert_same(expected, fast.reset(seed=1, options=options)[0], ("reset", options))
            assert_same(expected, unchunked.reset(seed=1, options=options)[0], ("reset", options))
            ended = False
            while not ended:
                chunk = rng.uniform(-1, 1, (K, 7)).astype(np.float32)
                for action in chunk:
                    expected, _, terminated, truncated, _ = slow.step(action)
                    got = unchunked.step(action)
                    assert_same(expected, got[0], ("unchunked step", options, slow.steps))
                    assert got[2:4] == (terminated, truncated)
                    if terminated or truncated:
                        break
                obs, _, chunk_terminated, chunk_truncated, info = fast.step(chunk)
                assert_same(expected, obs, ("chunk", options, slow.steps))
                assert (chunk_terminated, chunk_truncated) == (terminated, truncated)
                ended = terminated or truncated
            assert truncated and info["actions_executed"] == CAP % K  # the cap fell inside a chunk
    finally:
        for env in (slow, fast, unchunked):
            env.close()


def press_the_stove_button(env: LiberoEnv) -> None:
    import mujoco

    sim = env._sim.env.sim
    joint = mujoco.mj_name2id(sim.model._model, mujoco.mjtObj.mjOBJ_JOINT, "flat_stove_1_button")
    sim.data._data.qpos[sim.model._model.jnt_qposadr[joint]] = 1.0
    mujoco.mj_forward(sim.model._model, sim.data._data)


def test_a_success_on_a_step_whose_observation_was_not_wanted_hands_out_its_real_final_frame():
    """LIBERO-Goal's "turn on the stove": the success lights the burner (a site's colour that
    LIBERO changes after the step), inside a chunk, where the cameras were closed. The final
    frame is the one robosuite renders when every camera renders every step: the scene at
    the step's last camera sample, with the burner as it was then."""
    slow, fast = reference("libero_goal", (7,)), LiberoEnv("libero_goal", (7,), **settings())
    try:
        for env in (slow, fast):
            env.reset(seed=0, options={"task_index": 0, "trial": 4})
            env.step(np.zeros(7, np.float32))
            press_the_stove_button(env)
        fast.observation_wanted = False  # what ActionChunks sets for a chunk's inner actions
        expected, reward, terminated, _, _ = slow.step(np.zeros(7, np.float32))
        got, fast_reward, fast_terminated, _, _ = fast.step(np.zeros(7, np.float32))
        assert terminated and fast_terminated and reward == fast_reward == 5.0
        assert_same(expected, got, "the success's final frame")
        fast.observation_wanted = True
        assert fast.reset(seed=0, options={"task_index": 0, "trial": 4})[0]["task_id"] == 7
    finally:
        slow.close()
        fast.close()


@pytest.mark.parametrize("suite, tasks, resets, asset_cache", [
    ("libero_object", (0, 3), [(0, 0), (0, 9), (1, 5), (1, 6), (0, 2)], False),  # built without cached assets
    ("libero_goal", (4,), [(0, 11), (0, 30)], True),
])
def test_a_soft_reset_starts_from_the_state_a_rebuild_starts_from(suite, tasks, resets, asset_cache):
    """The simulator's whole state (time, qpos, qvel) and the observation, after the wait
    steps, whatever episode came before (the previous one ends with the gripper closed)."""
    hard = LiberoEnv(suite, tasks, **settings(soft_reset=False))
    soft = LiberoEnv(suite, tasks, **settings(asset_cache=asset_cache))
    closing = np.array([0.3, -0.2, 0.1, 0.0, 0.0, 0.2, 1.0], np.float32)
    try:
        for task_index, trial in resets:
            options = {"task_index": task_index, "trial": trial}
            expected, _ = hard.reset(seed=3, options=options)
            got, _ = soft.reset(seed=3, options=options)
            assert_same(expected, got, options)
            np.testing.assert_array_equal(soft._sim.env.sim.get_state().flatten(),
                                          hard._sim.env.sim.get_state().flatten(), err_msg=str(options))
            for env in (hard, soft):
                for _ in range(4):
                    env.step(closing)
    finally:
        hard.close()
        soft.close()


def test_two_envs_of_one_process_on_different_scenes_render_what_each_renders_alone():
    """robosuite renders into, and frees its render context in, whichever GL context is
    current, and each build makes its own current: the env makes its own current first."""

    def play(env: LiberoEnv, task_index: int) -> list[np.ndarray]:
        return [env.reset(seed=1, options={"task_index": task_index, "trial": 0})[0]["main_image"]]

    alone = []
    for task_index in (0, 1):
        env = LiberoEnv("libero_10", (0, 2), **settings())  # a living room, then a kitchen
        frames = play(env, task_index)
        frames += [env.step(np.zeros(7, np.float32))[0]["main_image"] for _ in range(3)]
        env.close()
        alone.append(frames)
    living_room, kitchen = LiberoEnv("libero_10", (0, 2), **settings()), LiberoEnv("libero_10", (0, 2), **settings())
    try:
        together = [play(living_room, 0), play(kitchen, 1)]
        for _ in range(3):
            for env, frames in zip((living_room, kitchen), together):
                frames.append(env.step(np.zeros(7, np.float32))[0]["main_image"])
        for frames, expected in zip(together, alone):
            for step, (got, want) in enumerate(zip(frames, expected)):
                assert np.array_equal(got, want), step
    finally:
        living_room.close()
        kitchen.close()
