"""Where a LIBERO scene's free objects are: in the simulator now, or in a recorded init state.

LIBERO's init states are placements, not rest poses: the sampler leaves each object a little
above its support, and the env's settling steps drop it. How an object lands depends on
MuJoCo's contact code, so these poses are what `tests/test_libero_settling.py` checks before
the MuJoCo pin moves (docs/libero.md, "The MuJoCo pin").
"""

from __future__ import annotations

import numpy as np


def free_object_joints(robosuite_env) -> dict[str, str]:
    """Each object that moves freely (a free joint), by its name in the task: its joint's name."""
    return {name: obj.joints[-1] for name, obj in robosuite_env.objects_dict.items() if obj.joints}


def object_poses(robosuite_env, qpos: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each free object's pose (x, y, z, qw, qx, qy, qz) in the world frame, from `qpos`
    (a MuJoCo qpos vector) or else from the simulator's current state."""
    model = robosuite_env.sim.model
    qpos = robosuite_env.sim.data.qpos if qpos is None else qpos
    poses = {}
    for name, joint in free_object_joints(robosuite_env).items():
        start, _ = model.get_joint_qpos_addr(joint)
        poses[name] = np.array(qpos[start:start + 7], np.float64)
    return poses


def object_speeds(robosuite_env) -> dict[str, float]:
    """Each free object's linear speed now, in m/s."""
    model, qvel = robosuite_env.sim.model, robosuite_env.sim.data.qvel
    speeds = {}
    for name, joint in free_object_joints(robosuite_env).items():
        start, _ = model.get_joint_qvel_addr(joint)
        speeds[name] = float(np.linalg.norm(qvel[start:start + 3]))
    return speeds


def init_state_qpos(init_state: np.ndarray, nq: int) -> np.ndarray:
    """The qpos inside a flattened MuJoCo state as LIBERO records it: [time, qpos, qvel]."""
    return np.asarray(init_state)[1:1 + nq]


def tilt_degrees(pose: np.ndarray) -> float:
    """How far an object's own z axis leans from the world's vertical, in degrees."""
    _, x, y, _ = pose[3:7] / np.linalg.norm(pose[3:7])
    return float(np.degrees(np.arccos(np.clip(1.0 - 2.0 * (x * x + y * y), -1.0, 1.0))))
