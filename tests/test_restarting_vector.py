"""RestartingVectorEnv: the same steps as gym's own vector env, and a killed env process
started again without touching the other envs."""

import os
import signal

import gymnasium as gym
import numpy as np
import pytest

from fleetrl.envs.restarting_vector import RestartingVectorEnv
from fleetrl.envs.vector import make_vector_env


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


class FailsAtStep(gym.Wrapper):
    def step(self, action):
        raise ValueError("the env's own bug")


def failing_cartpole() -> gym.Env:
    return FailsAtStep(cartpole())


def play(envs: gym.vector.VectorEnv, steps: int, rng: np.random.Generator, kill=None):
    obs, _ = envs.reset(seed=[3, 4])
    out = [obs]
    for t in range(steps):
        if kill is not None and t == kill[0]:
            os.kill(envs.env_pids()[kill[1]], signal.SIGKILL)
        obs, reward, terminated, truncated, _ = envs.step(rng.integers(2, size=2))
        out.append((obs, reward, terminated, truncated, list(getattr(envs, "restarted", []))))
    return out


def test_it_steps_as_gyms_vector_env_does_with_next_step_autoreset():
    ours = make_vector_env(cartpole, 2, asynchronous=True)
    assert isinstance(ours, RestartingVectorEnv)
    gyms = make_vector_env(cartpole, 2, asynchronous=False)
    try:
        a, b = play(ours, 120, np.random.default_rng(0)), play(gyms, 120, np.random.default_rng(0))
    finally:
        ours.close()
        gyms.close()
    np.testing.assert_array_equal(a[0], b[0])
    assert sum(bool(x[2].any() or x[3].any()) for x in a[1:]) >= 2  # episodes ended, and autoreset ran
    for x, y in zip(a[1:], b[1:]):
        for u, v in zip(x[:4], y[:4]):
            np.testing.assert_array_equal(u, v)


def test_a_killed_env_process_starts_again_with_a_new_episode_and_the_other_env_is_untouched():
    ours = RestartingVectorEnv([cartpole, cartpole], seed=5)
    reference = make_vector_env(cartpole, 2)
    try:
        old_pid = ours.env_pids()[1]
        a = play(ours, 40, np.random.default_rng(1), kill=(15, 1))
        b = play(reference, 40, np.random.default_rng(1))
        assert ours.env_pids()[1] != old_pid and ours.restarts == 1
    finally:
        ours.close()
        reference.close()
    restarted_at = [t for t, x in enumerate(a[1:]) if x[4]]
    assert restarted_at == [15] and a[16][4] == [1]
    obs, reward, terminated, truncated, _ = a[16]
    assert reward[1] == 0 and not terminated[1] and not truncated[1]
    assert np.abs(obs[1]).max() <= 0.05  # CartPole's reset draws its state in [-0.05, 0.05]
    for x, y in zip(a[1:], b[1:]):  # env 0 never noticed
        np.testing.assert_array_equal(x[0][0], y[0][0])
        assert x[1][0] == y[1][0] and x[2][0] == y[2][0]


def test_an_exception_in_the_env_fails_the_step_with_its_traceback():
    envs = RestartingVectorEnv([cartpole, failing_cartpole])
    try:
        envs.reset(seed=0)
        with pytest.raises(RuntimeError, match="the env's own bug"):
            envs.step(np.zeros(2, np.int64))
    finally:
        envs.close()
