"""Problems whose agent is a flow-matching VLA: pi0 or pi0.5 (`fleetrl.agents.pi0.flow_vla_agent`).

`FlowVLAProblem` holds what every such Problem shares: the model (a pi0 or pi0.5
checkpoint folder, a PaliGemma folder with a fresh expert, or `tiny`), its tokenizer and
statistics, the sampler (denoise steps, noise method, which steps are stochastic), the
value head and its learning rate, which parts train, and the policy's log-prob: the
Gaussian denoise steps' log-probs per executed action and dim, which `logprob_type`
reduces (one PPO ratio per chunk by default, as RLinf's). The denoising chain and the stochastic steps
are recorded on the learner with each step (`learner_action_specs`) and never sent to
actors. Teacher forcing, and the supervised warm start it makes with
`algorithm=supervised, teacher_forcing_fraction=1`, trains pi0's flow-matching loss on the
oracle's chunk (under `oracle_key`).

A subclass gives the env (`make_env`: a one-action Box env whose observation holds the
keys that the class attributes `IMAGE_KEYS`, `STATE_KEY` and `LANGUAGE_KEY` name, and the
oracle's chunk under `oracle_key` when teacher forcing is on) and `corpus()`, the text the
tiny model's tokenizer learns; `check_spaces` holds the env to that.
docs/examples/point_line.py is a whole one, with every key's dtype and shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch

from fleetrl.agents.base import AgentOutput, Observation
from fleetrl.agents.pi0.agent_config import FlowVLAAgentConfig
from fleetrl.agents.pi0.flow_vla_agent import FlowVLAAgent, chunk_shape
from fleetrl.agents.pi0.tiny import TinyPi0Config, build_tiny_pi0
from fleetrl.common.settings import check_range, setting
from fleetrl.envs.teacher_forcing import TEACHER_FORCING
from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.base import Problem, ProblemConfig
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults
from fleetrl.proto.tensors import Specs, TensorSpec

CHAIN, STOCHASTIC = "chain", "stochastic"  # the learner-side action fields


@dataclasses.dataclass
class FlowVLAConfig(ProblemConfig, FlowVLAAgentConfig):
    """The flow-VLA Problems' settings: the agent's (agents/pi0/agent_config.py, each one a
    flag too) and the training's."""

    value_learning_rate: float = setting(0.0, "The value head's learning rate (RLinf: 1e-4 beside the policy's "
                                              "5e-6); 0: learning_rate.")
    algorithm: str = "ppo"
    chunk_size: int = 5
    learning_rate: float = 3e-4
    max_grad_norm: float = 1.0
    entropy_cost: float = 0.0  # the denoising policy's entropy has no closed form (entropy() is 0)
    epochs: int | None = 2
    minibatches: int | None = 2

    def __post_init__(self):
        super().__post_init__()  # ProblemConfig's checks, then FlowVLAAgentConfig's
        check_range("value_learning_rate", self.value_learning_rate, low=0)


class FlowVLAProblem(Problem):
    Config = FlowVLAConfig
    IMAGE_KEYS: tuple[str, ...] = ("image",)
    STATE_KEY, LANGUAGE_KEY = "state", "language"
    # Denoising serves the whole fleet at once; PPO waits for it.
    learner_defaults = LearnerDefaults(block_inference_on_training=True, batch_size=16, unroll_length=8,
                                       best_metric="success")
    launch_defaults = LaunchDefaults(num_actors=2, envs_per_actor=8, eval_envs_per_actor=8)

    def corpus(self) -> list[str]:
        """Text like the instructions, for the tiny model's tokenizer."""
        raise NotImplementedError(
            f"{type(self).__name__} has no corpus(): model_path=tiny trains its tokenizer on it. Define "
            "corpus(self) -> list[str], returning text like the instructions (every instruction, or a template "
            "filled with every word an instruction may use), or pass --model_path to a real checkpoint")

    def check_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        """The keys, dtypes and shapes the flow agent reads (docs/flow_vla.md, "Another
        continuous Problem"), each refused with the fix."""
        name, c = type(self).__name__, self.config
        if not isinstance(observation_space, gym.spaces.Dict):
            keys = [*self.IMAGE_KEYS, self.STATE_KEY, self.LANGUAGE_KEY]
            raise ValueError(f"{name}: make_env's observation_space is a {type(observation_space).__name__}; the "
                             f"flow VLA reads a gym.spaces.Dict with keys {keys}")
        spaces = observation_space.spaces

        def box(key: str, role: str) -> gym.spaces.Box:
            space = spaces.get(key)
            if not isinstance(space, gym.spaces.Box):
                raise ValueError(f"{name}: the observation has no Box {key!r} ({role}); it has {sorted(spaces)}. Put "
                                 f"it in make_env's observation, or set the class attribute naming the key")
            return space

        for key in self.IMAGE_KEYS:
            image = box(key, "a camera image, named in IMAGE_KEYS")
            if image.dtype != np.uint8 or len(image.shape) != 3 or image.shape[-1] != 3:
                hint = " (channels last: [H, W, 3], not [3, H, W])" if image.shape[:1] == (3,) else ""
                raise ValueError(f"{name}: image {key!r} is {image.dtype} {image.shape}; the flow VLA reads uint8 "
                                 f"RGB images of shape [H, W, 3]{hint}")
        state = box(self.STATE_KEY, "the robot's state, STATE_KEY")
        if len(state.shape) != 1 or not np.issubdtype(state.dtype, np.floating):
            raise ValueError(f"{name}: state {self.STATE_KEY!r} is {state.dtype} {state.shape}; the flow VLA reads a "
                             "float32 vector [state_dim]")
        language = box(self.LANGUAGE_KEY, "the instruction's UTF-8 bytes, LANGUAGE_KEY")
        if len(language.shape) != 1 or language.dtype != np.uint8:
            raise ValueError(f"{name}: language {self.LANGUAGE_KEY!r} is {language.dtype} {language.shape}; the flow "
                             "VLA reads the instruction as uint8 [max_bytes]: its UTF-8 bytes, zero-padded")
        one_action = (c.chunk_size,) if c.chunk_size > 1 else ()
        if not isinstance(action_space, gym.spaces.Box) or action_space.shape[:len(one_action)] != one_action \
                or len(action_space.shape) != len(one_action) + 1:
            shape = action_space.shape if isinstance(action_space, gym.spaces.Box) else action_space
            inner = shape[1:] if c.chunk_size > 1 and isinstance(action_space, gym.spaces.Box) else shape
            raise ValueError(f"{name}: make_env's action_space is {inner}; the flow VLA needs a Box of one action, "
                             f"[action_dim] (fleetrl plays chunks of chunk_size={c.chunk_size} itself)")
        if c.teacher_forcing_fraction > 0:
            action_dim = action_space.shape[-1]
            oracle = spaces.get(c.oracle_key)
            if oracle is None:
                raise ValueError(f"{name}: teacher_forcing_fraction={c.teacher_forcing_fraction} and the observation "
                                 f"has no {c.oracle_key!r} (the oracle's next actions, oracle_key); add it to "
                                 f"make_env's observation, a float32 Box [chunk_size, action_dim] = "
                                 f"[{c.chunk_size}, {action_dim}]")
            if tuple(oracle.shape) not in {(c.chunk_size, action_dim), (c.chunk_size * action_dim,)}:
                raise ValueError(f"{name}: the oracle {c.oracle_key!r} has shape {tuple(oracle.shape)}; it must be "
                                 f"[chunk_size, action_dim] = [{c.chunk_size}, {action_dim}]: the oracle's next "
                                 f"chunk_size actions")

    def model_path(self) -> str:
        c = self.config
        if c.model_path != "tiny":
            return c.model_path
        return build_tiny_pi0(self.corpus(), TinyPi0Config(pi05=c.variant == "pi05", action_dim=c.action_width,
                                                           action_horizon=c.action_horizon or c.chunk_size))

    @property
    def action_dim(self) -> int:
        return int(np.prod(self._spaces[1].shape[1:] if self.config.chunk_size > 1 else self._spaces[1].shape))

    def make_agent(self) -> FlowVLAAgent:
        agent = FlowVLAAgent(dataclasses.replace(self.config, model_path=self.model_path()), self.action_dim,
                             self.IMAGE_KEYS, self.STATE_KEY, self.LANGUAGE_KEY)
        # The value head's own rate: make_optimizer gets this agent's parameters, not their names.
        self._value_parameter_ids = {id(p) for p in agent.value_head.parameters()}
        return agent

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """Adam on what trains (the frozen prefix has no optimizer state); the value head at
        its own rate (value_learning_rate)."""
        trainable = [p for p in params if p.requires_grad]
        c = self.config
        value = getattr(self, "_value_parameter_ids", set()) if c.value_learning_rate else set()
        groups = [{"params": [p for p in trainable if id(p) not in value], "lr": c.learning_rate}]
        if value:
            groups.append({"params": [p for p in trainable if id(p) in value], "lr": c.value_learning_rate})
        return torch.optim.Adam(groups, lr=c.learning_rate, eps=c.adam_eps, betas=c.adam_betas(), foreach=True)

    def action_policy(self) -> ActionPolicy:
        c = self.config
        horizon, width = chunk_shape(self.model_path(), c.action_width, c.action_horizon or c.chunk_size)
        return FlowChunkPolicy(c, self.action_space(), horizon, width, problem=self)

    def episode_metrics(self, final_info: Mapping[str, object]) -> dict[str, float]:
        return {"success": float(final_info.get("success", 0.0))}

    def episode_metric_names(self) -> tuple[str, ...]:
        return ("success",)


class FlowChunkPolicy(ActionPolicy):
    """The policy over denoised chunks: the agent samples them (or plays the ODE in eval
    mode) with their chain's log-prob; the chain and its stochastic steps are recorded on
    the learner and never sent to actors."""

    def __init__(self, config: FlowVLAConfig, action_space: gym.Space, horizon: int, width: int, problem=None):
        super().__init__(config, action_space, problem)
        self.horizon, self.width = horizon, width

    def learner_action_specs(self) -> Specs:
        c = self.config
        return (TensorSpec(CHAIN, np.dtype(np.float32), (c.denoise_steps + 1, self.horizon, self.width)),
                TensorSpec(STOCHASTIC, np.dtype(bool), (c.denoise_steps,)))

    def select_actor_action(self, agent_output: AgentOutput, observation: Observation,
                            extras: Mapping[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        """The denoised chunk (the agent samples it, or plays the ODE in eval mode); in a
        teacher-forced episode, the oracle's. The chain and its stochastic steps stay here."""
        action = agent_output["actions"]
        if self.config.chunk_size == 1:
            action = action[:, 0]
        forced = extras.get(TEACHER_FORCING)
        if forced is not None and bool(forced.any()):
            oracle = observation[self.config.oracle_key].to(action.dtype).reshape(action.shape)
            action = torch.where(forced.reshape(-1, *[1] * (action.dim() - 1)), oracle, action)
        return {"action": action, CHAIN: agent_output[CHAIN], STOCHASTIC: agent_output[STOCHASTIC]}

    def _per_token(self, values: torch.Tensor) -> torch.Tensor:
        """[..., H, D] per action and dim, as fleetrl.losses.chunks reads them; summed without chunks."""
        return values.sum((-1, -2)) if self.config.chunk_size == 1 else values

    def action_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """At acting, the sampled chain's; in training, the recorded chain's under the current weights."""
        key = "chain_log_prob" if "chain_log_prob" in agent_output else "log_prob"
        return self._per_token(agent_output[key])

    def teacher_forcing_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Minus pi0's flow-matching error on the oracle's chunk, per action and dim."""
        return self._per_token(-agent_output["flow_matching_error"])

    def entropy(self, agent_output: AgentOutput) -> torch.Tensor:
        """Zero: a denoising chain's action has no closed-form entropy."""
        key = "chain_log_prob" if "chain_log_prob" in agent_output else "log_prob"
        return torch.zeros_like(self._per_token(agent_output[key]))
