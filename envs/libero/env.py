"""One LIBERO simulator as a Gymnasium env: a suite's tasks, reset by global reset_state_id.

Observation:
  main_image   [S, S, 3] uint8  agentview camera, rotated 180 degrees (LIBERO renders upside down)
  wrist_image  [S, S, 3] uint8  eye-in-hand camera, rotated likewise
  state        [8] float32      end-effector position (3), axis-angle (3), gripper joints (2)
  language     [L] uint8        the task's instruction as UTF-8, zero-padded
  task_id      [] int64         the task's index in the suite
Action: [7] float32 in [-1, 1]: delta end-effector position (3) and rotation (3), then the
gripper, -1 open and +1 closed (LIBERO's convention).
Reward: `reward_coef` when the task succeeds (only the first time with `reward_once`),
minus `step_penalty` every step. Success ends the episode unless `ignore_terminations`;
`max_episode_steps` (per suite by default) truncates it.
Info, every step: `success` (this step), `success_once`, `return` and `episode_len` so far,
and `task_id`; the last step's info is the episode's metrics, which a vector env with
same-step autoreset hands back as `final_info` (see fleetrl.envs.vector).
Action chunks: `fleetrl.envs.action_chunks.ActionChunks` plays [K, 7] chunks (chunk_step).

Speed (docs/libero.md has the figures). On a CPU host rendering is most of a step, so the
cameras render only for observations that leave the env: ActionChunks sets
`observation_wanted` to False for all but a chunk's last action, and a reset renders only
its last wait step (`fleetrl.envs.libero.camera_gate`; what leaves the env is bit-identical
to rendering always, final frames included). Resets are soft: the simulator is built once
per task and reset in place (`soft_reset`), with the gripper's stored command zeroed as a
rebuild would. `render_every_step` renders as robosuite does by default, every camera at
every step (for videos of every action). `episodes_per_task` > 1 keeps a task for that many episodes, which saves the
rebuilds a task change costs, at the price of less mixed batches. `msaa=False` renders
without multisampling (faster on CPUs; edges change by a few levels of 255).
`mesh_detail` < 1 renders lighter scenes: every visual mesh keeps that fraction of its faces
(`fleetrl.envs.libero.light_meshes`; renders several times faster on a CPU, the physics
unchanged). `asset_cache=False` empties MuJoCo's asset cache after each build: 0.5-0.6 GB less per
process, and a task change's build takes about twice as long (an env of one task that
resets softly never builds again, so it always empties the cache).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import gymnasium as gym
import numpy as np

from fleetrl.envs.libero.camera_gate import CameraGate, make_current, renew_render_context, set_msaa
from fleetrl.envs.libero.config import prepare_libero
from fleetrl.envs.libero.light_meshes import DecimatedFaces, decimate_visual_meshes
from fleetrl.envs.libero.object_poses import init_state_qpos, object_poses, object_speeds
from fleetrl.envs.libero.reset_states import ResetStates

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
# Episode caps in common use (the demonstrations' longest, with margin).
MAX_EPISODE_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520,
                     "libero_90": 400}
# Tasks per suite, for sizing an eval set without loading the suite; each task has 50 init states.
NUM_TASKS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
LANGUAGE_BYTES = 128
OPEN_GRIPPER = -1.0


def axis_angle(quaternion: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> axis * angle, as robosuite's quat2axisangle."""
    x, y, z, w = quaternion
    w = float(np.clip(w, -1.0, 1.0))
    den = math.sqrt(max(1.0 - w * w, 0.0))
    if den < 1e-8:
        return np.zeros(3, np.float32)
    return (np.array([x, y, z]) * 2.0 * math.acos(w) / den).astype(np.float32)


@functools.cache
def benchmark_suite(name: str):
    """LIBERO's benchmark object for a suite, built once per process: it reads only task files
    (never changed), and each build prints "[info] using task orders" again."""
    prepare_libero()
    from libero.libero import benchmark  # after prepare_libero: importing it reads the config

    return benchmark.get_benchmark_dict()[name]()


def action_space() -> gym.spaces.Box:
    """7 numbers in [-1, 1]: delta position and rotation, then the gripper (-1 open, +1
    closed). A new one per env: a space holds its own random generator."""
    return gym.spaces.Box(-1.0, 1.0, (7,), np.float32)


def observation_space(image_size: int, num_tasks: int) -> gym.spaces.Dict:
    """What a LIBERO env hands out, the demonstrations' replay too: main and wrist camera
    images, the 8-dim state, the instruction as bytes and the task id."""
    image = gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
    return gym.spaces.Dict({
        "main_image": image, "wrist_image": image,
        "state": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32),
        "language": gym.spaces.Box(0, 255, (LANGUAGE_BYTES,), np.uint8),
        "task_id": gym.spaces.Box(0, num_tasks - 1, (), np.int64),
    })


def encode_language(text: str, length: int = LANGUAGE_BYTES) -> np.ndarray:
    data = text.encode("utf-8")[:length]
    return np.frombuffer(data.ljust(length, b"\0"), dtype=np.uint8).copy()


def decode_language(data: np.ndarray) -> str:
    return bytes(np.asarray(data, np.uint8)).rstrip(b"\0").decode("utf-8", errors="replace")


class LiberoEnv(gym.Env):
    def __init__(self, suite: str = "libero_10", task_ids: tuple[int, ...] = (), image_size: int = 128,
                 max_episode_steps: int | None = None, num_wait_steps: int = 10, reward_coef: float = 5.0,
                 reward_once: bool = True, step_penalty: float = 0.0, ignore_terminations: bool = False,
                 soft_reset: bool = True, msaa: bool = True, episodes_per_task: int = 1,
                 render_every_step: bool = False, asset_cache: bool = True, mesh_detail: float = 1.0):
        if suite not in SUITES:
            raise ValueError(f"unknown LIBERO suite {suite!r}; choose from {SUITES}")
        if episodes_per_task < 1:
            raise ValueError(f"episodes_per_task must be at least 1, got {episodes_per_task}")
        if not 0.0 < mesh_detail <= 1.0:
            raise ValueError(f"mesh_detail is the fraction of visual mesh faces kept, in (0, 1]; got {mesh_detail}")
        prepare_libero()
        self.suite_name, self.image_size, self.num_wait_steps = suite, image_size, num_wait_steps
        self.max_episode_steps = max_episode_steps or MAX_EPISODE_STEPS[suite]
        self.reward_coef, self.reward_once, self.step_penalty = reward_coef, reward_once, step_penalty
        self.ignore_terminations = ignore_terminations
        self.soft_reset, self.msaa, self.episodes_per_task = soft_reset, msaa, episodes_per_task
        self.render_every_step = render_every_step
        self.asset_cache, self.mesh_detail = asset_cache, mesh_detail
        self._decimated = DecimatedFaces()  # kept across builds: a scene built again is not decimated again
        self.observation_wanted = True  # a hint for the next step only (ActionChunks sets it)
        self._pinned_task, self._pinned_left = 0, 0
        self.suite = benchmark_suite(suite)
        all_tasks = range(self.suite.get_num_tasks())
        self.task_ids = tuple(task_ids) or tuple(all_tasks)
        if not set(self.task_ids) <= set(all_tasks):
            unknown = sorted(set(self.task_ids) - set(all_tasks))
            raise ValueError(f"{suite} has tasks 0..{len(all_tasks) - 1}, not {unknown}")
        self._init_states = [self.suite.get_task_init_states(t) for t in self.task_ids]
        self.reset_states = ResetStates([len(s) for s in self._init_states])
        self._sim = None
        self._sim_task: int | None = None
        self._gate: CameraGate | None = None
        self.observation_space = observation_space(image_size, num_tasks=len(all_tasks))
        self.action_space = action_space()

    def _simulator(self, task: int):
        """The task's simulator; building one takes seconds, so it is kept while the task stays."""
        if self._sim_task != task:
            from libero.libero.envs import OffScreenRenderEnv

            self.close()
            spec = self.suite.get_task(task)
            bddl = self.suite.get_task_bddl_file_path(task) if hasattr(self.suite, "get_task_bddl_file_path") \
                else spec.bddl_file
            # hard_reset=False: robosuite's constructor builds the simulator, and resets then
            # keep it (LIBERO's default rebuilds it at every reset, the first one included).
            self._sim = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=self.image_size,
                                           camera_widths=self.image_size, hard_reset=not self.soft_reset)
            self._sim_task, self.language = task, spec.language
            self._prepare_rendering()
            if not self.asset_cache or len(self.task_ids) == 1 and self.soft_reset:  # no build will reuse it
                clear_asset_cache()
            release_free_memory()
        return self._sim

    def _prepare_rendering(self) -> None:
        """The camera gate, multisampling and mesh detail, set again after robosuite rebuilds
        (a hard reset)."""
        self._gate = CameraGate(self._sim.env)
        if self.msaa and self.mesh_detail == 1.0:
            return
        if not self.msaa:
            set_msaa(self._sim.env, 0)
        if self.mesh_detail < 1.0:
            decimate_visual_meshes(self._sim.env.sim.model._model, self.mesh_detail, self._decimated)
        renew_render_context(self._sim.env)

    def reset(self, *, seed=None, options=None):
        """options={"reset_state_id": i}, or {"task_index": t, "trial": j} (t indexes `task_ids`),
        picks the (task, init state); otherwise one is drawn at random."""
        super().reset(seed=seed)
        options = options or {}
        if "task_index" in options:
            reset_state_id = self.reset_states.reset_state_id(int(options["task_index"]), int(options["trial"]))
        elif "reset_state_id" in options:
            reset_state_id = int(options["reset_state_id"])
        else:
            reset_state_id = self._draw_reset_state()
        index, trial = self.reset_states.task_trial(reset_state_id)
        self.task = self.task_ids[index]
        sim = self._simulator(self.task)
        sim.seed(int(self.np_random.integers(2**31)))
        zero_gripper_commands(sim.env)  # a rebuilt gripper starts from zero; a kept one remembers
        self._render_next(False)
        make_current(sim.env)  # a hard reset frees the render context in the current GL context
        sim.reset()
        if not self.soft_reset:
            self._prepare_rendering()  # robosuite rebuilt the simulator, its sensors and render context
        self._render_next(self.num_wait_steps == 0)
        raw = sim.set_init_state(self._init_states[index][trial])
        for i in range(self.num_wait_steps):  # let objects settle, gripper open
            self._render_next(i == self.num_wait_steps - 1)
            raw, _, _, _ = sim.step([0.0] * 6 + [OPEN_GRIPPER])
        self.steps, self.succeeded, self.episode_return, self.reset_state_id = 0, False, 0.0, reset_state_id
        self.observation_wanted = True
        return self._observe(raw), {"task_id": self.task, "reset_state_id": reset_state_id}

    def object_poses(self) -> dict[str, np.ndarray]:
        """Each free object's pose now, (x, y, z, qw, qx, qy, qz) by its name in the task."""
        return object_poses(self._sim.env)

    def object_speeds(self) -> dict[str, float]:
        """Each free object's linear speed now, in m/s."""
        return object_speeds(self._sim.env)

    def init_object_poses(self) -> dict[str, np.ndarray]:
        """Each free object's pose in the current episode's recorded init state, before the
        settling steps moved it."""
        index, trial = self.reset_states.task_trial(self.reset_state_id)
        qpos = init_state_qpos(self._init_states[index][trial], self._sim.env.sim.model.nq)
        return object_poses(self._sim.env, qpos)

    def _render_next(self, wanted: bool) -> bool:
        """Opens the cameras for the next simulator step if its images are wanted (always,
        with render_every_step); whether they are open."""
        self._gate.set(wanted or self.render_every_step)
        return self._gate.open

    def _draw_reset_state(self) -> int:
        """A (task, init state) at random; with episodes_per_task N > 1, the task is drawn once
        every N episodes and only the init state at each."""
        if self.episodes_per_task == 1:
            return int(self.np_random.integers(len(self.reset_states)))
        if self._pinned_left == 0:
            self._pinned_task = int(self.np_random.integers(self.reset_states.num_tasks))
            self._pinned_left = self.episodes_per_task
        self._pinned_left -= 1
        trial = int(self.np_random.integers(self.reset_states.counts[self._pinned_task]))
        return self.reset_states.reset_state_id(self._pinned_task, trial)

    def step(self, action):
        action = np.clip(np.asarray(action, np.float64).reshape(7), -1.0, 1.0)
        render = self.observation_wanted or self.steps + 1 >= self.max_episode_steps  # or it truncates
        render = self._render_next(render)
        raw, _, done, _ = self._sim.step(action.tolist())
        self.observation_wanted = True
        self.steps += 1
        success = bool(done)
        paid = success and not (self.reward_once and self.succeeded)
        reward = (self.reward_coef if paid else 0.0) - self.step_penalty
        self.succeeded |= success
        self.episode_return += reward
        terminated = success and not self.ignore_terminations
        truncated = not terminated and self.steps >= self.max_episode_steps
        if terminated and not render:  # the episode's final observation leaves the env after all
            raw = {**raw, **self._gate.render_closed_step()}
        info = {"success": success, "success_once": self.succeeded, "return": self.episode_return,
                "episode_len": self.steps, "task_id": self.task, "reset_state_id": self.reset_state_id}
        return self._observe(raw), float(reward), terminated, truncated, info

    def _observe(self, raw: dict) -> dict[str, np.ndarray]:
        state = np.concatenate([raw["robot0_eef_pos"], axis_angle(raw["robot0_eef_quat"]),
                                raw["robot0_gripper_qpos"]]).astype(np.float32)
        return {"main_image": np.ascontiguousarray(raw["agentview_image"][::-1, ::-1]),
                "wrist_image": np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1]),
                "state": state, "language": encode_language(self.language), "task_id": np.int64(self.task)}

    def close(self):
        if self._sim is not None:
            make_current(self._sim.env)  # robosuite frees the render context in the current GL context
            self._sim.close()
            self._sim, self._sim_task, self._gate = None, None, None


def zero_gripper_commands(robosuite_env) -> None:
    """Zeroes each gripper's stored command, as a rebuilt gripper has it: the Panda gripper
    integrates its commands, so a soft reset would otherwise start from the last episode's."""
    for robot in robosuite_env.robots:
        grippers = robot.gripper.values() if isinstance(robot.gripper, dict) else [robot.gripper]
        for gripper in grippers:
            gripper.current_action = np.zeros_like(gripper.current_action)


def clear_asset_cache() -> None:
    """Empties MuJoCo's asset cache (this process's decoded meshes and textures, 0.4-0.5 GB
    for a LIBERO scene), which only speeds up building a scene again. (A capacity of 0
    instead crashes MuJoCo 3.3.7's compiler.)"""
    import mujoco

    mujoco.mj_clearCache(mujoco.mj_getCache())


def release_free_memory() -> None:
    """Hands the heap's free pages back to the system (glibc's malloc_trim): building a
    simulator frees hundreds of MB in fragments that the process would otherwise keep."""
    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
        if trim is not None:
            trim(0)
