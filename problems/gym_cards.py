"""The gym_cards tasks as Problems: a conv + LSTM agent learns them from pixels.

Registered as gym_cards/numberline, gym_cards/ezpoints, gym_cards/points24 and
gym_cards/blackjack. Metrics per episode: success (return > 0, as the RL4VLM paper
counts it), with the return and length that every Problem reports. With
`teacher_forcing_fraction` > 0, that share of the episodes follows the task's solver
(`envs/gym_cards/solvers.py`) and trains on its actions by cross-entropy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from fleetrl.agents import Agent, ConvLSTMAgent
from fleetrl.agents.conv_lstm import OBSERVATION_NORMS
from fleetrl.common.settings import check_choice, setting
from fleetrl.envs.gym_cards import ENVS
from fleetrl.envs.gym_cards.oracle import SolverOracle
from fleetrl.problems.base import Problem, ProblemConfig
from fleetrl.problems.defaults import LearnerDefaults


@dataclasses.dataclass
class GymCardsConfig(ProblemConfig):
    algorithm: str = "ppo"
    # The original images are 300x300; the agent reads them at this size. NumberLine's big
    # digits survive 32x32; card ranks need 64x64 (see CardTableConfig).
    image_size: int = 32
    conv_channels: tuple[int, ...] = (32, 64, 64)
    lstm_size: int = 128
    # CleanRL's pixel-PPO recipe (with the agent's orthogonal init and per-image
    # standardization): NumberLine reaches 99% success in about 15k env steps.
    learning_rate: float = 5e-4
    discount: float = 0.9
    entropy_cost: float = 0.01
    baseline_cost: float = 0.5
    epochs: int | None = 4
    minibatches: int | None = 4
    # Episodes are capped at this many steps, as the original registration does.
    max_episode_steps: int = 300
    # Points24 only: deal only hands that can make 24.
    solvable_only: bool = False
    solver_accuracy: float = setting(1.0, "With teacher_forcing_fraction > 0, the task's solver is the oracle; this "
                                          "is the share of steps in which it names the right action.")
    observation_norm: str = setting("image", "How the agent standardizes images: image (each by its own mean and "
                                             "std) or running (each pixel by the training images' running mean and "
                                             "std; fleetrl.agents.observation_norm).")

    def __post_init__(self):
        super().__post_init__()
        check_choice("observation_norm", self.observation_norm, OBSERVATION_NORMS)


@dataclasses.dataclass
class NumberLineConfig(GymCardsConfig):
    """NumberLine's images differ only in two digits. Standardized each by itself, a
    converged policy's features kept collapsing (dips to 47% on every seed); per pixel,
    over the running statistics, the agent reads only the digits.

    Once it has converged, its batches are quiet, and one rare mistake's gradient, scaled up
    by advantage normalization and carried on by Adam's momentum, could flip another state's
    greedy action through the features they share. So NumberLine trains on raw advantages,
    starts each batch's momentum from zero, and bounds every state's KL per batch
    (docs/notes/numberline_dips.md)."""

    observation_norm: str = "running"
    target_kl: float | None = 0.02
    normalize_advantages: bool = False
    reset_momentum_each_batch: bool = True
    max_state_kl: float | None = 0.1


@dataclasses.dataclass
class CardTableConfig(GymCardsConfig):
    """The card tasks: ranks and the formula line are only legible from 64x64 up. Narrower
    convolutions and 2 epochs keep a 2-core machine at about 100 env steps/s."""

    image_size: int = 64
    conv_channels: tuple[int, ...] = (16, 32, 32)
    epochs: int | None = 2


class GymCardsProblem(Problem):
    TASK: ClassVar[str] = ""
    Config = GymCardsConfig
    # On-policy PPO: inference waits for each update, and batches of 32 unrolls of 10
    # steps give 16 minibatch steps of 80 transitions each.
    learner_defaults = LearnerDefaults(block_inference_on_training=True, batch_size=32, unroll_length=10)

    def make_env(self) -> gym.Env:
        c = self.config
        return card_env(self.TASK, c.image_size, c.solvable_only, c.max_episode_steps,
                        oracle_accuracy=c.solver_accuracy if c.teacher_forcing_fraction > 0 else None)

    def make_agent(self) -> Agent:
        logits = self.action_policy().policy_logits_size()
        return ConvLSTMAgent(self.config.image_size, logits, tuple(self.config.conv_channels),
                             lstm_size=self.config.lstm_size, observation_norm=self.config.observation_norm)

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        return {"success": float(final_info["success"])}

    def episode_metric_names(self) -> tuple[str, ...]:
        return ("success",)

    def render_frame(self, observation: Mapping[str, np.ndarray], env: gym.Env | None = None) -> np.ndarray:
        return observation["image"]


def card_env(task: str, image_size: int, solvable_only: bool, max_episode_steps: int,
             wrap: Callable[[gym.Env], gym.Env] | None = None, oracle_accuracy: float | None = None,
             oracle_text_bytes: int = 256) -> gym.Env:
    """A gym_cards task as its Problems play it: episodes capped at `max_episode_steps` and
    reporting success, then `wrap` (a text description of the state, say), then, with an
    `oracle_accuracy`, the task's solver as the teacher-forcing oracle."""
    kwargs: dict[str, Any] = {"image_size": image_size}
    if task == "Points24":
        kwargs["solvable_only"] = solvable_only
    env: gym.Env = EpisodeSuccess(gym.wrappers.TimeLimit(ENVS[task](**kwargs), max_episode_steps))
    if wrap is not None:
        env = wrap(env)
    if oracle_accuracy is not None:
        env = SolverOracle(env, oracle_accuracy, oracle_text_bytes)
    return env


class EpisodeSuccess(gym.Wrapper):
    """info["success"]: whether the episode's return so far is above 0 (RL4VLM's success)."""

    def reset(self, **kwargs):
        self._return = 0.0
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "success": False}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        return obs, reward, terminated, truncated, {**info, "success": self._return > 0}


class NumberLineProblem(GymCardsProblem):
    Config = NumberLineConfig
    name = "gym_cards/numberline"
    TASK = "NumberLine"


class EZPointsProblem(GymCardsProblem):
    Config = CardTableConfig
    name = "gym_cards/ezpoints"
    TASK = "EZPoints"


class Points24Problem(GymCardsProblem):
    Config = CardTableConfig
    name = "gym_cards/points24"
    TASK = "Points24"


class BlackjackProblem(GymCardsProblem):
    Config = CardTableConfig
    name = "gym_cards/blackjack"
    TASK = "Blackjack"
