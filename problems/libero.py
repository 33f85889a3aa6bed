"""LIBERO robot manipulation: a small VLA agent learns a suite's tasks on the real simulator.

Registered as `libero`. `--suite=libero_10` (or `--hparams=suite=libero_10`) picks the suite,
`task_ids` a subset of its tasks. The agent emits chunks of `chunk_size` 7-dim actions
(see fleetrl.agents.vla and fleetrl.envs.action_chunks) and trains with PPO by default, or
GRPO with `algorithm=grpo,group_size=G` (group members share each reset state).

Training resets draw (task, init state) at random; the eval set is every (task, trial) of
the chosen tasks, `eval_trials_per_task` trials each, and the learner's eval rounds hand
each one to exactly one eval actor. Episode metrics: success_once, return, episode_len, and
success per task (`task_{i}/success`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym

from fleetrl.agents.vla import TEXT_ENCODERS, VALUE_POOLINGS, VLAAgent
from fleetrl.common.settings import check_choice
from fleetrl.envs.libero.env import MAX_EPISODE_STEPS, NUM_TASKS, SUITES, LiberoEnv
from fleetrl.problems.continuous_control import GaussianPolicyConfig, GaussianPolicyProblem
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults


@dataclasses.dataclass
class LiberoConfig(GaussianPolicyConfig):
    # The env (fleetrl.envs.libero.env.LiberoEnv documents each).
    suite: str = "libero_spatial"
    task_ids: tuple[int, ...] = ()  # empty: every task of the suite
    image_size: int = 64
    max_episode_steps: int = 0  # 0: the suite's usual cap (220 to 520 steps)
    num_wait_steps: int = 10
    reward_coef: float = 5.0
    reward_once: bool = True
    step_penalty: float = 0.0
    ignore_terminations: bool = False
    # The eval set: this many init states of every chosen task (LIBERO's protocol is 50).
    eval_trials_per_task: int = 50
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
        check_choice("LIBERO suite", self.suite, SUITES)
        check_choice("text_encoder", self.text_encoder, TEXT_ENCODERS)
        check_choice("value_pooling", self.value_pooling, VALUE_POOLINGS)


class LiberoProblem(GaussianPolicyProblem):
    name = "libero"
    Config = LiberoConfig
    # A simulator is about 2 GB: an actor with several envs steps them in subprocesses.
    envs_in_subprocesses: ClassVar[bool] = True
    learner_defaults = LearnerDefaults(block_inference_on_training=True, batch_size=8, unroll_length=16,
                                       best_metric="success_once")
    launch_defaults = LaunchDefaults(num_actors=2, envs_per_actor=1, eval_envs_per_actor=1)

    @property
    def task_ids(self) -> tuple[int, ...]:
        return tuple(self.config.task_ids) or tuple(range(NUM_TASKS[self.config.suite]))

    def make_env(self) -> gym.Env:
        c = self.config
        return LiberoEnv(c.suite, self.task_ids, c.image_size, c.max_episode_steps or MAX_EPISODE_STEPS[c.suite],
                         c.num_wait_steps, c.reward_coef, c.reward_once, c.step_penalty, c.ignore_terminations)

    def make_agent(self) -> VLAAgent:
        c = self.config
        return VLAAgent(action_size=7, chunk_size=c.chunk_size, channels=tuple(c.conv_channels),
                        hidden_size=c.hidden_size, grid=c.image_grid, text_encoder=c.text_encoder,
                        value_pooling=c.value_pooling, initial_log_std=c.initial_log_std)

    def num_eval_episodes(self) -> int:
        return len(self.task_ids) * self.config.eval_trials_per_task

    def eval_reset(self, episode: int) -> tuple[int, dict[str, Any] | None]:
        """Episode e plays trial e % trials of the (e // trials)-th chosen task."""
        task_index, trial = divmod(episode, self.config.eval_trials_per_task)
        return self.config.eval_seed + episode, {"task_index": task_index, "trial": trial}

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        success = float(final_info["success_once"])
        return {"success_once": success, "episode_len": float(final_info["episode_len"]),
                f"task_{int(final_info['task_id'])}/success": success}
