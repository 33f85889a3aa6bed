"""What `envs.space_check.SpaceCheck` costs an actor: per step, and per reset.

    python -m fleetrl.bench.space_check

SpaceCheck checks each observation a reset returns, and only those, against the space;
a step pays one wrapper call and a try block. This measures, side by side in one sitting:
- CartPole stepped bare and wrapped (its resets included, one every ~20 random steps);
- the check of one LIBERO-sized observation (two 128x128x3 uint8 cameras, an 8-dim state,
  256 instruction bytes), paid once an episode of hundreds of simulator actions.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from absl import app, flags

from fleetrl.envs.space_check import SpaceCheck, observation_mismatch

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined when run, not on import: every fleetrl module imports in one process (tests)."""
    flags.DEFINE_integer("steps", 200_000, "CartPole steps per timing.")
    flags.DEFINE_integer("repeats", 5, "Timings of each; the median is printed.")


def steps_per_s(env: gym.Env, steps: int) -> float:
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(2, size=steps)
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def main(argv: list[str]) -> None:
    del argv
    bare, wrapped = [], []
    for _ in range(FLAGS.repeats):  # interleaved, so drift hits both alike
        bare.append(steps_per_s(gym.make("CartPole-v1").unwrapped, FLAGS.steps))
        wrapped.append(steps_per_s(SpaceCheck(gym.make("CartPole-v1").unwrapped, "cartpole"), FLAGS.steps))
    b, w = float(np.median(bare)), float(np.median(wrapped))
    print(f"CartPole steps/s: bare {b:,.0f}, with SpaceCheck {w:,.0f} ({w / b:.3f}x); "
          f"{(1 / w - 1 / b) * 1e9:,.0f} ns a step")

    image = gym.spaces.Box(0, 255, (128, 128, 3), np.uint8)
    space = gym.spaces.Dict({"main_image": image, "wrist_image": image,
                             "state": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32),
                             "language": gym.spaces.Box(0, 255, (256,), np.uint8)})
    obs = space.sample()
    count = 20_000
    start = time.perf_counter()
    for _ in range(count):
        observation_mismatch(space, obs)
    check_us = (time.perf_counter() - start) / count * 1e6
    print(f"LIBERO-sized observation check: {check_us:.1f} us, once a reset")


if __name__ == "__main__":
    define_flags()
    app.run(main)
