"""The Problem API, after VALAN's `problem_type.py`.

A Problem is everything task-specific, in one place that fits on a page:

- actor side: `make_env`, `episode_metrics` and `eval_reset` (actors never build an agent);
- learner side: `make_agent`, `make_optimizer`, the `action_policy` (how agent outputs
  become actions and log-probs) and the training `algorithm` (see fleetrl.losses.algorithms).

A Problem holds its config and nothing else: no counters, no buffers, no RNG. All run
state lives in the learner and actor, so a Problem can be rebuilt anywhere from its name
and its `--hparams` (which is exactly how actors get theirs).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from fleetrl.agents.base import Agent, AgentOutput, Observation, State
from fleetrl.common.settings import check_choice, check_range, setting
from fleetrl.envs.action_chunks import ACTION_REWARDS, ACTIONS_EXECUTED, ActionChunks
from fleetrl.envs.space_check import SpaceCheck
from fleetrl.envs.teacher_forcing import TEACHER_FORCING, TeacherForcingDraws
from fleetrl.losses.algorithms import ALGORITHMS, Algorithm, get_algorithm, unread_setting
from fleetrl.losses.config import LossConfig
from fleetrl.losses.lr_schedule import SCHEDULES
from fleetrl.problems.action_policy import POLICY_METHODS, ActionPolicy
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults
from fleetrl.problems.hparams import apply_hparams
from fleetrl.proto.tensors import Specs, TensorSpec, specs_from_space


@dataclasses.dataclass
class ProblemConfig(LossConfig):
    """Settings every Problem has: the loss (see LossConfig) and the optimizer. Subclasses add their own."""

    learning_rate: float = setting(1e-3, "Adam's learning rate (at the start, with a schedule).")
    learning_rate_schedule: str = setting("constant", "constant, or linear: decay the learning rate to 0 over "
                                                      "--total_env_steps, if the run has one "
                                                      "(fleetrl.losses.lr_schedule).")
    learning_rate_warmup_updates: int = setting(
        0, "Optimizer steps over which the learning rate rises linearly from 0 to its value, so that a fresh Adam's "
           "first steps do not knock a warm-started or pretrained model off (fleetrl.losses.lr_schedule); 0: none.")
    adam_eps: float = setting(1e-8, "Adam's epsilon.")
    adam_beta1: float = setting(0.9, "Adam's first-moment decay (its momentum); 0 takes each step from the current "
                                     "gradient alone.")
    adam_beta2: float = setting(0.999, "Adam's second-moment decay.")
    reset_momentum_each_batch: bool = setting(False, "Zero Adam's first moment at the start of each batch's updates, "
                                                     "so one batch's steps do not carry on into the next "
                                                     "(Asadi et al. 2023, 'Resetting the Optimizer in Deep RL').")
    max_grad_norm: float = setting(40.0, "Gradients are clipped to this global norm.")
    teacher_forcing_fraction: float = setting(
        0.0, "The share of episodes that execute the oracle's action and train with cross-entropy on it instead of "
             "RL (VALAN's mix for navigation); needs the oracle in the observation under oracle_key.")
    teacher_forcing_cost: float = setting(1.0, "Weight of the teacher-forcing cross-entropy.")
    oracle_key: str = setting("oracle_action", "The observation that holds the oracle's action.")
    chunk_size: int = setting(1, "Actions per agent step: above 1, actors play each chunk of K actions "
                                 "(fleetrl.envs.action_chunks) and reward_type and logprob_type say how the loss "
                                 "sees them.")
    eval_episodes: int = setting(100, "The eval set: episodes 0 .. eval_episodes-1, each reset by "
                                      "Problem.eval_reset; eval rounds and launch.evaluate play the same ones.")
    eval_seed: int = setting(1_000_000, "Seed of the eval set's first episode (episode e resets with seed + e).")

    def __post_init__(self):
        check_choice("algorithm", self.algorithm, sorted(ALGORITHMS))  # registered ones, users' included
        super().__post_init__()
        check_range("teacher_forcing_fraction", self.teacher_forcing_fraction, low=0, high=1)
        check_range("learning_rate", self.learning_rate, low=0, low_open=True)
        check_choice("learning_rate_schedule", self.learning_rate_schedule, SCHEDULES)
        for name in ("chunk_size", "eval_episodes"):
            check_range(name, getattr(self, name), low=1)
        check_range("learning_rate_warmup_updates", self.learning_rate_warmup_updates, low=0)
        for name in ("adam_beta1", "adam_beta2"):
            check_range(name, getattr(self, name), low=0, high=1, high_open=True)

    def adam_betas(self) -> tuple[float, float]:
        return (self.adam_beta1, self.adam_beta2)


def _defaults_of(config_cls: type) -> Any:
    """The config class's own default values, by field name (a Problem's config may change
    LossConfig's defaults)."""
    return types.SimpleNamespace(**{f.name: f.default for f in dataclasses.fields(config_cls)
                                    if f.default is not dataclasses.MISSING})


class Problem:
    """Base class. Subclasses set `name` and `Config`, and implement `make_env` and `make_agent`."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = ProblemConfig
    # Learner and launcher settings this Problem trains best with, for runs that leave them
    # unset (see fleetrl.problems.defaults), for example block_inference_on_training for PPO.
    learner_defaults: ClassVar[LearnerDefaults] = LearnerDefaults()
    launch_defaults: ClassVar[LaunchDefaults] = LaunchDefaults()
    # Heavy simulators: an actor with more than one env steps them in subprocesses
    # (one env stays in-process), whatever its async_envs flag says.
    envs_in_subprocesses: ClassVar[bool] = False
    # The learner refuses a reward or an episode metric beyond this magnitude: a value that
    # large is a bug, and would turn the curves and the stop condition to inf.
    metric_bound: ClassVar[float] = 1e9

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()
        # Here, not in the config's __post_init__: an algorithm may dataclasses.replace the
        # config with values of its own (GRPO turns normalize_advantages off), and that is
        # no user's setting.
        unread = dataclasses.is_dataclass(self.config) and unread_setting(self.config,
                                                                           _defaults_of(type(self.config)))
        if unread:
            raise ValueError(unread)

    def __getattr__(self, name: str) -> Any:
        # Problems written before action policies call these on themselves: they still answer.
        if name in POLICY_METHODS:
            return getattr(self.action_policy(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_hparams(cls, overrides: Mapping[str, str]) -> Problem:
        return cls(apply_hparams(cls.Config(), overrides))

    # ----- actor side -----

    def make_env(self) -> gym.Env:
        """One environment. Actors build many, step them as a batch and seed them through reset."""
        raise NotImplementedError

    def make_actor_env(self) -> gym.Env:
        """The env as actors step it: `make_env`, playing chunks of actions when chunk_size > 1,
        and drawing teacher-forced episodes when teacher_forcing_fraction > 0. Every reset's
        observation is checked against the env's observation space (`envs.space_check`)."""
        env = SpaceCheck(self.make_env(), self.name or f"{type(self).__module__}:{type(self).__qualname__}")
        if self.config.chunk_size > 1:
            env = ActionChunks(env, self.config.chunk_size)
        if self.config.teacher_forcing_fraction > 0:
            env = TeacherForcingDraws(env, self.config.teacher_forcing_fraction)
        return env

    def make_eval_env(self) -> gym.Env:
        """The env as eval episodes play it (eval actors, launch.evaluate): `make_actor_env`,
        unless eval must render or score under other settings than training."""
        return self.make_actor_env()

    def num_eval_episodes(self) -> int:
        """The size of the eval set; override when the data decides it (a split's size)."""
        return self.config.eval_episodes

    def eval_reset(self, episode: int) -> tuple[int, dict[str, Any] | None]:
        """The reset (seed, options) of eval episode `episode`. Override to walk a data split
        or every task and init state, say by passing options={"episode_index": episode}."""
        return self.config.eval_seed + episode, None

    def render_frame(self, observation: Mapping[str, np.ndarray], env: gym.Env | None = None) -> np.ndarray | None:
        """One env's current frame as an RGB image [H, W, 3] uint8, for recorded episodes
        (`launch.evaluate --record`): the first uint8 image observation, else the env's own
        render when it was made with render_mode="rgb_array" (as CartPole's is); None: nothing
        to draw."""
        for value in observation.values():
            if value.dtype == np.uint8 and value.ndim == 3 and value.shape[-1] == 3:
                return value
            if value.dtype == np.uint8 and value.ndim == 2:
                return np.repeat(value[..., None], 3, axis=-1)
        if env is not None and env.render_mode == "rgb_array":
            return env.render()
        return None

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        """Extra metrics of an episode from its last step's info ('return' and 'length' are
        automatic). Declare their names in `episode_metric_names`."""
        return {}

    def episode_metric_names(self) -> tuple[str, ...] | None:
        """Every name `episode_metrics` may return for a train episode; the learner refuses
        any other. None: not declared, and the learner takes a few names first come (see
        docs/reliability.md). A Problem that keeps the base `episode_metrics` reports none."""
        return () if type(self).episode_metrics is Problem.episode_metrics else None

    # ----- specs, shared by both sides and checked at the handshake -----

    @functools.cached_property
    def _spaces(self) -> tuple[gym.Space, gym.Space]:
        env = self.make_actor_env()
        try:
            spaces = env.observation_space, env.action_space
        finally:
            env.close()
        self.check_spaces(*spaces)
        return spaces

    def check_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        """Raises ValueError, naming the key and the fix, where the actor env's spaces (chunks
        and teacher forcing applied) do not fit what this Problem's agent reads. Runs once,
        when the specs are first asked for: at the learner's start and the actor's."""

    def observation_specs(self) -> Specs:
        return specs_from_space(self._spaces[0], "observation")

    def action_specs(self) -> Specs:
        return specs_from_space(self._spaces[1], "action")

    def action_space(self) -> gym.Space:
        """The env's action space, which bounds every action actors execute."""
        return self._spaces[1]

    def extra_specs(self) -> Specs:
        """Per-step extras that actors send beside each observation: fields that features or
        the algorithm need in training, never model inputs. An actor reads each from the
        step's info under its name (zeros where the info lacks it, as on a reset); the
        learner validates and records them, and the losses read them from `batch.extras`.
        A Problem with a feature of its own adds to them:
        `return super().extra_specs() + (TensorSpec("my_field", np.dtype(np.float32), (3,)),)`."""
        specs = []
        if self.config.chunk_size > 1:  # fleetrl.envs.action_chunks
            specs += [TensorSpec(ACTION_REWARDS, np.dtype(np.float32), (self.config.chunk_size,)),
                      TensorSpec(ACTIONS_EXECUTED, np.dtype(np.int64), (), low=0, high=self.config.chunk_size)]
        if self.config.teacher_forcing_fraction > 0:  # fleetrl.envs.teacher_forcing
            specs.append(TensorSpec(TEACHER_FORCING, np.dtype(bool), ()))
        return tuple(specs)

    # ----- learner side -----

    def make_agent(self) -> Agent:
        raise NotImplementedError

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        # foreach: one call per update for all tensors, not a Python loop over them (CPU's default).
        return torch.optim.Adam(params, lr=self.config.learning_rate, eps=self.config.adam_eps,
                                betas=self.config.adam_betas(), fused=True)

    def action_policy(self) -> ActionPolicy:
        """How agent outputs become the actions actors execute and the log-probs the losses
        read (problems/action_policy.py); the default is categorical over `policy_logits`."""
        return ActionPolicy(self.config, self.action_space(), problem=self)

    def agent_step(self, agent: Agent, observation: Observation, first: torch.Tensor, state: State,
                   extras: Mapping[str, torch.Tensor]) -> tuple[AgentOutput, State]:
        """The learner's inference step on B envs: `agent.step`. A Problem whose actions are
        expensive to draw can use the step's extras to skip the rows that do not need them
        (the VLM Problems skip generation in teacher-forced episodes, which play the oracle)."""
        return agent.step(observation, first, state)

    def algorithm(self) -> Algorithm:
        """How batches of unrolls train the agent; the default is `config.algorithm` from the registry."""
        return get_algorithm(self.config.algorithm)
