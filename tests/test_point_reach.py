"""PointReach: the instruction names the target, the image shows it, the expert reaches it."""

import gymnasium as gym
import numpy as np
import pytest

from fleetrl.envs.point_reach import COLOURS, TARGET_RADIUS, PointReachEnv


def play_expert(env, seed: int, chunk: int = 1) -> tuple[float, int]:
    obs, _ = env.reset(seed=seed)
    while True:
        for action in obs["oracle_action"][:chunk]:
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                return info["success"], env.unwrapped._steps


@pytest.mark.parametrize("chunk", [1, 4])
def test_the_expert_reaches_the_named_target_in_every_episode(chunk):
    env = PointReachEnv(oracle_chunk=4)
    results = [play_expert(env, seed, chunk) for seed in range(300)]
    assert all(success == 1.0 for success, _ in results)
    assert max(steps for _, steps in results) < env.max_episode_steps


def test_a_noisy_expert_heads_for_another_target_in_its_share_of_episodes():
    env = PointReachEnv(oracle_chunk=1, expert_accuracy=0.6)
    success = np.mean([play_expert(env, seed)[0] for seed in range(1000)])
    assert 0.55 < success < 0.65, success


def test_an_expert_that_steers_off_curves_in_and_fails_a_tight_time_limit_more_often():
    def rate(error, limit):
        env = PointReachEnv(oracle_chunk=4, num_targets=1, layout="slots", expert_heading_error=error,
                            max_episode_steps=limit)
        return np.mean([play_expert(env, seed, chunk=4)[0] for seed in range(300)])

    assert rate(0, 10) == 1.0
    tight = rate(75, 10)
    assert 0.45 < tight < 0.7  # measured 0.56
    assert rate(75, 60) > tight + 0.1  # given time, it curves in more often (a wall stops some spirals)
    env = PointReachEnv(oracle_chunk=1, num_targets=1, expert_heading_error=75)
    obs, _ = env.reset(seed=3)
    target, position = env.unwrapped._targets[0], obs["state"]
    cosine = obs["oracle_action"][0] @ (target - position) / np.linalg.norm(obs["oracle_action"][0]) / np.linalg.norm(
        target - position)
    turn = np.degrees(np.arccos(np.clip(cosine, -1, 1)))
    assert 0 < turn <= 75
    with pytest.raises(ValueError, match="expert_heading_error"):
        PointReachEnv(expert_heading_error=90)


def test_the_instruction_names_the_goals_colour_and_the_image_shows_the_targets():
    env = PointReachEnv(image_size=48)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        text = bytes(obs["language"]).rstrip(b"\0").decode()
        colour = env._colours[info["goal"]]
        assert text == f"go to the {colour} target"
        image = obs["image"]
        for centre, name in zip(env._targets, env._colours):
            col = int((centre[0] + 1) / 2 * 48)
            row = int((1 - centre[1]) / 2 * 48)
            assert tuple(image[row, col]) == COLOURS[name]
        point = env._position
        assert tuple(image[int((1 - point[1]) / 2 * 48), int((point[0] + 1) / 2 * 48)]) == (255, 255, 255)


def test_touching_another_target_ends_the_episode_without_reward():
    env = PointReachEnv()
    env.reset(seed=3)
    other = (env._goal + 1) % env.num_targets
    env._position = env._targets[other] + np.array([TARGET_RADIUS + 0.05, 0.0])
    _, reward, terminated, truncated, info = env.step(np.array([-1.0, 0.0]))
    assert terminated and not truncated and reward == 0.0 and info["success"] == 0.0


def test_an_episode_that_reaches_nothing_is_truncated():
    env = PointReachEnv(max_episode_steps=5)
    env.reset(seed=0)
    for _ in range(5):
        _, reward, terminated, truncated, info = env.step(np.zeros(2))
    assert truncated and not terminated and reward == 0.0 and info["success"] == 0.0


def test_it_is_registered_and_refuses_bad_settings():
    env = gym.make("fleetrl/PointReach-v0", image_size=16)
    assert env.observation_space["image"].shape == (16, 16, 3)
    with pytest.raises(ValueError, match="num_targets"):
        PointReachEnv(num_targets=7)
    with pytest.raises(ValueError, match="expert_accuracy"):
        PointReachEnv(expert_accuracy=1.5)


def test_the_slots_layout_keeps_the_places_and_draws_the_colours():
    env = PointReachEnv(layout="slots", oracle_chunk=1)
    places, colourings = set(), set()
    for seed in range(30):
        env.reset(seed=seed)
        places.add(tuple(np.round(env._targets.ravel(), 6)))
        colourings.add(tuple(env._colours))
    assert len(places) == 1 and len(colourings) > 10
    assert all(play_expert(env, seed)[0] == 1.0 for seed in range(100))
    with pytest.raises(ValueError, match="layout"):
        PointReachEnv(layout="grid")
