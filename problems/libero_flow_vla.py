"""LIBERO with pi0 or pi0.5 (`fleetrl.agents.pi0.flow_vla_agent`), played as openpi plays it and
fine-tuned as RLinf does.

Registered as `libero_flow_vla`: the `libero` Problem's tasks, simulator settings, eval
set and metrics (`fleetrl.problems.libero_tasks`). openpi's LIBERO protocol is the
default: both cameras rendered at 256 px and rotated 180 degrees (the env), resized with
pad to the model's 224 (the agent, as openpi's client); the 8-dim state (end-effector
position, axis-angle, gripper joints); the task's language as the prompt; 10 wait steps
of openpi's dummy action [0, 0, 0, 0, 0, 0, -1] after each reset (the env); the first 5
actions of every denoised chunk executed (`chunk_size`, openpi's replan_steps), 7 env
dims; the suites' step caps; 50 trials per task in eval. pi0_libero's delta actions need
`--delta_action_dims=6` (pi05_libero has none). docs/flow_vla.md has the commands.

The recipe: a few-shot warm start on LIBERO's released demonstrations
(`--demo_files=a.hdf5,b.hdf5 --algorithm=supervised --teacher_forcing_fraction=1`: actors
replay the files, `fleetrl.envs.libero.demo_replay`, and the learner trains pi0's
flow-matching loss on their action chunks), then PPO on the simulator from that checkpoint
(`--init_checkpoint`, no `--demo_files`). With `--demo_files` the task ids are the files'
order; without, the suite's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym

from fleetrl.common.settings import setting
from fleetrl.envs.libero.demo_replay import LiberoDemoReplay
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults
from fleetrl.problems.flow_vla import FlowVLAConfig, FlowVLAProblem
from fleetrl.problems.libero_tasks import LiberoTasks, LiberoTasksConfig


@dataclasses.dataclass
class LiberoFlowVLAConfig(FlowVLAConfig, LiberoTasksConfig):
    demo_files: tuple[str, ...] = setting((), "LIBERO demonstration files (HDF5) that actors replay instead of "
                                              "running the simulator: the supervised warm start's data.")
    chunk_size: int = 5  # openpi's replan_steps, RLinf's action_chunk
    image_size: int = 256  # openpi's LIBERO client renders 256 and resizes with pad to the model's 224
    learning_rate: float = 5e-6  # RLinf's policy rate; the value head's is value_learning_rate
    value_learning_rate: float = 1e-4

    def __post_init__(self):
        super().__post_init__()
        self.check_tasks()
        if self.teacher_forcing_fraction > 0 and not self.demo_files:
            raise ValueError("teacher forcing on libero_flow_vla needs demonstrations: the simulator has no oracle; "
                             "pass --demo_files")


class LiberoFlowVLAProblem(LiberoTasks, FlowVLAProblem):
    name = "libero_flow_vla"
    Config = LiberoFlowVLAConfig
    IMAGE_KEYS = ("main_image", "wrist_image")
    learner_defaults = LearnerDefaults(block_inference_on_training=True, batch_size=8, unroll_length=16,
                                       best_metric="success_once")
    launch_defaults = LaunchDefaults(num_actors=2, envs_per_actor=1, eval_envs_per_actor=1)

    def make_env(self) -> gym.Env:
        c = self.config
        if c.demo_files:
            return LiberoDemoReplay(c.demo_files, image_size=c.image_size, chunk_size=c.chunk_size)
        return self.make_simulator()

    def corpus(self) -> list[str]:
        """The chosen tasks' instructions and the demonstrations', the same for a warm start on
        demonstrations of those tasks and the simulator's run after it (one tiny model)."""
        simulator = self.make_simulator()
        texts = {simulator.suite.get_task(t).language for t in self.task_ids}
        simulator.close()
        if self.config.demo_files:
            texts |= set(LiberoDemoReplay(self.config.demo_files, image_size=8).instructions)
        return sorted(texts)

    def eval_reset(self, episode: int) -> tuple[int, dict[str, Any] | None]:
        if self.config.demo_files:  # replayed demonstrations: each eval episode one of them
            return self.config.eval_seed + episode, {"demo_index": episode}
        return super().eval_reset(episode)
