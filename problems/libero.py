"""LIBERO robot manipulation: a small VLA agent learns a suite's tasks on the real simulator.

Registered as `libero`. `--suite=libero_10` (or `--hparams=suite=libero_10`) picks the suite,
`task_ids` a subset of its tasks. The agent emits chunks of `chunk_size` 7-dim actions
(see fleetrl.agents.vla and fleetrl.envs.action_chunks) and trains with PPO by default, or
GRPO with `algorithm=grpo,group_size=G` (group members share each reset state).

The suite, the simulator's settings, the eval set and the metrics are every LIBERO
Problem's (`fleetrl.problems.libero_tasks`); `libero_flow_vla` is the same tasks with the
flow-matching VLA (`fleetrl.problems.libero_flow_vla`).
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym

from fleetrl.agents.vla import TEXT_ENCODERS, VALUE_POOLINGS, VLAAgent
from fleetrl.common.settings import check_choice
from fleetrl.problems.continuous_control import GaussianPolicyConfig, GaussianPolicyProblem
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults
from fleetrl.problems.libero_tasks import LiberoTasks, LiberoTasksConfig


@dataclasses.dataclass
class LiberoConfig(GaussianPolicyConfig, LiberoTasksConfig):
    # The agent (fleetrl.agents.vla.VLAAgent).
    text_encoder: str = "minilm"  # a frozen sentence embedding; "bytes" needs no extra package
    conv_channels: tuple[int, ...] = (16, 32, 32)
    hidden_size: int = 128
    image_grid: int = 4
    value_pooling: str = "mean"
    # The loss: PPO over chunks of 5 actions, rewards summed per chunk.
    algorithm: str = "ppo"
    chunk_size: int = 5
    action_squash: str = "clip"
    initial_log_std: float = -1.0
    learning_rate: float = 3e-4
    max_grad_norm: float = 1.0
    entropy_cost: float = 0.0
    epochs: int | None = 2
    minibatches: int | None = 2

    def __post_init__(self):
        super().__post_init__()
        self.check_tasks()
        check_choice("text_encoder", self.text_encoder, TEXT_ENCODERS)
        check_choice("value_pooling", self.value_pooling, VALUE_POOLINGS)


class LiberoProblem(LiberoTasks, GaussianPolicyProblem):
    name = "libero"
    Config = LiberoConfig
    learner_defaults = LearnerDefaults(block_inference_on_training=True, batch_size=8, unroll_length=16,
                                       best_metric="success_once")
    launch_defaults = LaunchDefaults(num_actors=2, envs_per_actor=1, eval_envs_per_actor=1)

    def make_env(self) -> gym.Env:
        return self.make_simulator()

    def make_agent(self) -> VLAAgent:
        c = self.config
        return VLAAgent(action_size=7, chunk_size=c.chunk_size, channels=tuple(c.conv_channels),
                        hidden_size=c.hidden_size, grid=c.image_grid, text_encoder=c.text_encoder,
                        value_pooling=c.value_pooling, initial_log_std=c.initial_log_std)
