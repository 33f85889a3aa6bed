"""LIBERO with the flow-matching VLA (pi0-class), as RLinf fine-tunes pi0 on LIBERO.

Registered as `libero_flow_vla`: the `libero` Problem's tasks, simulator settings, eval
set and metrics (`fleetrl.problems.libero_tasks`), with `fleetrl.agents.flow_vla` reading
both cameras, the instruction and the 8-dim state, and denoising chunks of 7-dim actions.

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
    chunk_size: int = 5  # RLinf's LIBERO configs
    learning_rate: float = 5e-5

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
