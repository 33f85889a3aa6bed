"""What every LIBERO Problem shares, whatever its agent: the suite and tasks, the simulator's
settings, the eval set, and the episode metrics.

Training resets draw (task, init state) at random; the eval set is every (task, trial) of
the chosen tasks, `eval_trials_per_task` trials each, and the learner's eval rounds hand
each one to exactly one eval actor. Episode metrics: success_once, episode_len, and success
per task (`task_{i}/success`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym

from fleetrl.common.settings import check_choice, check_range
from fleetrl.envs.libero.env import MAX_EPISODE_STEPS, NUM_TASKS, SUITES, LiberoEnv


@dataclasses.dataclass
class LiberoTasksConfig:
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
    # Speed on CPU hosts (docs/libero.md has the figures). soft_reset keeps the simulator and
    # resets it in place (the initial states equal a rebuild's); episodes_per_task N > 1 keeps
    # each env on one task for N training episodes, saving the rebuild that a task change
    # costs, at the price of fewer tasks in each batch; msaa=False renders training episodes
    # without multisampling (1.6-1.8x faster renders, edges differ by a few levels of 255);
    # eval always renders with it, so that success rates stay comparable; asset_cache=False
    # saves 0.5-0.6 GB per env process and makes a task change's build about twice as long.
    # mesh_detail < 1 renders training episodes with lighter scenes (each visual mesh keeps
    # that fraction of its faces: 0.25 renders 2.4x faster, pixels differ by 3-4 of 255 on
    # average; the physics is unchanged); eval always renders the scenes whole.
    soft_reset: bool = True
    asset_cache: bool = True
    episodes_per_task: int = 1
    msaa: bool = True
    mesh_detail: float = 1.0
    # The eval set: this many init states of every chosen task (LIBERO's protocol is 50).
    eval_trials_per_task: int = 50

    def check_tasks(self) -> None:
        check_choice("LIBERO suite", self.suite, SUITES)
        check_range("episodes_per_task", self.episodes_per_task, low=1)
        check_range("mesh_detail", self.mesh_detail, low=0, high=1, low_open=True)


class LiberoTasks:
    """Mixin for a Problem whose config is a `LiberoTasksConfig`; put it before `Problem`."""

    # A simulator is about 2 GB: an actor with several envs steps them in subprocesses.
    envs_in_subprocesses: ClassVar[bool] = True
    config: Any

    @property
    def task_ids(self) -> tuple[int, ...]:
        return tuple(self.config.task_ids) or tuple(range(NUM_TASKS[self.config.suite]))

    def make_simulator(self) -> gym.Env:
        c = self.config
        return LiberoEnv(c.suite, self.task_ids, c.image_size, c.max_episode_steps or MAX_EPISODE_STEPS[c.suite],
                         c.num_wait_steps, c.reward_coef, c.reward_once, c.step_penalty, c.ignore_terminations,
                         soft_reset=c.soft_reset, msaa=c.msaa, episodes_per_task=c.episodes_per_task,
                         asset_cache=c.asset_cache, mesh_detail=c.mesh_detail)

    def make_eval_env(self) -> gym.Env:
        """The actor env rendering as LIBERO does (multisampling on, whole meshes), whatever
        training renders with."""
        if self.config.msaa and self.config.mesh_detail == 1.0:
            return self.make_actor_env()
        return type(self)(dataclasses.replace(self.config, msaa=True, mesh_detail=1.0)).make_actor_env()

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

    def episode_metric_names(self) -> tuple[str, ...]:
        return ("success_once", "episode_len", *(f"task_{task}/success" for task in self.task_ids))
