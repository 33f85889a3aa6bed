"""Real LIBERO: the init states settle as they did for the published scores.

LIBERO records init states as placements a little above their supports, and the env's
settling steps drop the objects. Where they land depends on MuJoCo's contact code: from
MuJoCo 3.4 on, libero_spatial task 5's bowl lands elsewhere on its ramekin and policies
trained before fail that task (docs/libero.md, "The MuJoCo pin"). This file is the check
that must pass before the pin moves. Reference figures: MuJoCo 3.2.7, 3.3.0 and 3.3.7 all
give them, to the digits below. Under 3.4.0 this file fails for four tasks: task 5's bowl
lands 3.7 cm off, and libero_10 tasks 0, 1 and 7's soup can slides 0.84 cm and still rolls
when the first observation is taken (measured 2026-12-08).
"""

import numpy as np
import pytest

from fleetrl.envs.libero.config import mujoco_settling_warning
from fleetrl.envs.libero.env import LiberoEnv
from fleetrl.envs.libero.object_poses import tilt_degrees

pytestmark = [pytest.mark.slow, pytest.mark.libero]

# How far an object may drift sideways or lean while it drops onto its support. Measured
# under 3.3.7, the largest is 0.19 cm and 0.3 degrees (libero_10's soup can, a basket).
MAX_SLIDE_M = 0.005
MAX_LEAN_DEG = 1.0
# libero_spatial task 5, "pick up the black bowl on the ramekin": the bowl is placed 11 cm
# above the ramekin's centre and comes to rest leaning on it. Under MuJoCo 3.2.7 to 3.3.7 it
# rests 1.45 cm off the ramekin's centre along x, 3.51 cm above it, leaning 15.9 degrees;
# under 3.4.0 it rests 3.7 cm off (1.46, -3.42), 4.34 cm above, leaning 10.4 degrees.
RAMEKIN_TASK = 5
BOWL, RAMEKIN = "akita_black_bowl_1", "glazed_rim_porcelain_ramekin_1"
BOWL_ON_RAMEKIN_M = np.array([-0.0145, 0.0005, 0.0351])
BOWL_ON_RAMEKIN_LEAN_DEG = 15.95


def settled_scenes(suite: str):
    """For each task of the suite, its first init state: (task, env after the settling steps)."""
    env = LiberoEnv(suite, image_size=16, msaa=False)
    try:
        for task_index, task in enumerate(env.task_ids):
            env.reset(options={"task_index": task_index, "trial": 0})
            yield task, env
    finally:
        env.close()


@pytest.mark.parametrize("suite", ["libero_spatial", "libero_object", "libero_goal", "libero_10"])
def test_every_tasks_first_init_state_settles_in_place_and_not_yet_a_success(suite):
    moved = []
    for task, env in settled_scenes(suite):
        assert not env._sim.env._check_success(), f"{suite} task {task} is a success before any action"
        before, after = env.init_object_poses(), env.object_poses()
        assert before.keys() == after.keys() and after, f"{suite} task {task} has no free objects"
        for name in after:
            if (suite, task, name) == ("libero_spatial", RAMEKIN_TASK, BOWL):
                continue  # it lands leaning on the ramekin: the next test checks exactly where
            slide = float(np.linalg.norm(after[name][:2] - before[name][:2]))
            lean = abs(tilt_degrees(after[name]) - tilt_degrees(before[name]))
            if slide > MAX_SLIDE_M or lean > MAX_LEAN_DEG:
                moved.append(f"task {task} {name}: slid {slide * 100:.2f} cm, leans {lean:.1f} deg more")
        still_moving = {name: round(speed, 3) for name, speed in env.object_speeds().items() if speed > 0.01}
        assert not still_moving, f"{suite} task {task}: still moving after the settling steps (m/s): {still_moving}"
    assert not moved, f"{suite}: objects left their init states while settling: " + "; ".join(moved)


def test_the_bowl_on_the_ramekin_rests_where_mujoco_below_3_4_puts_it():
    env = LiberoEnv("libero_spatial", task_ids=(RAMEKIN_TASK,), image_size=16, msaa=False)
    try:
        for trial in (0, 17, 49):  # the placement differs between trials, the landing does not
            env.reset(options={"task_index": 0, "trial": trial})
            placed, rest = env.init_object_poses(), env.object_poses()
            assert placed[BOWL][2] - placed[RAMEKIN][2] == pytest.approx(0.11, abs=1e-3)  # placed above it
            on_ramekin = rest[BOWL][:3] - rest[RAMEKIN][:3]
            np.testing.assert_allclose(on_ramekin, BOWL_ON_RAMEKIN_M, atol=0.002, err_msg=(
                f"trial {trial}: the bowl rests elsewhere on the ramekin than MuJoCo < 3.4 puts it"))
            assert tilt_degrees(rest[BOWL]) == pytest.approx(BOWL_ON_RAMEKIN_LEAN_DEG, abs=1.0)
            assert tilt_degrees(rest[RAMEKIN]) < 1.0  # the ramekin itself stands flat on the table
            assert not env._sim.env._check_success()
    finally:
        env.close()


def test_a_mujoco_that_settles_differently_is_named_with_the_fix():
    assert mujoco_settling_warning("3.3.7") is None and mujoco_settling_warning("3.2.7") is None
    for version in ("3.4.0", "3.8.1", "4.0.0"):
        warning = mujoco_settling_warning(version)
        assert version in warning and "mujoco==3.3.7" in warning and "docs/libero.md" in warning
    assert "cannot read" in mujoco_settling_warning("dev")
