"""Problems whose agent is a flow-matching VLA (pi0-class, `fleetrl.agents.flow_vla`).

`FlowVLAProblem` holds what every such Problem shares: the model (a local PaliGemma
folder, or `tiny`), the action expert, the sampler (denoise steps, noise method, which
steps are stochastic), the value head, which parts train, and the policy's log-prob: the
Gaussian denoise steps' log-probs per action and dim, which `logprob_type` reduces (one
PPO ratio per chunk by default, as RLinf's). The denoising chain and the stochastic steps
are recorded on the learner with each step (`learner_action_specs`) and never sent to
actors. Teacher forcing, and the supervised warm start it makes with
`algorithm=supervised, teacher_forcing_fraction=1`, trains pi0's flow-matching loss on the
oracle's chunk (under `oracle_key`).

A subclass gives the env (`make_env`: a Box-action env whose observation holds the
`image_keys`, `state_key` and `language_key`, and the oracle's chunk when teacher forcing
is on) and `corpus()`, the text the tiny model's tokenizer learns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch

from fleetrl.agents.base import AgentOutput, Observation
from fleetrl.agents.flow_sampler import METHODS, STOCHASTIC_STEPS, FlowSamplerConfig
from fleetrl.agents.flow_vla import VALUE_POOLINGS, FlowVLAAgent
from fleetrl.agents.lora import LoraSpec
from fleetrl.agents.tiny_paligemma import build_tiny_paligemma
from fleetrl.common.settings import check_choice, check_range, setting
from fleetrl.envs.teacher_forcing import TEACHER_FORCING
from fleetrl.problems.base import Problem, ProblemConfig
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults
from fleetrl.proto.tensors import Specs, TensorSpec

CHAIN, STOCHASTIC = "chain", "stochastic"  # the learner-side action fields
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass
class FlowVLAConfig(ProblemConfig):
    model_path: str = setting("tiny", "A local folder that transformers loads as a PaliGemma (the prefix), or "
                                      "tiny: a small random one built here, for CPUs and tests. Nothing is "
                                      "downloaded.")
    action_width: int = setting(32, "The expert's action width (pi0's 32); the task's dims are padded to it, and "
                                    "the padding is masked everywhere.")
    expert_width: int = setting(0, "The action expert's hidden width; 0: half the prefix's (pi0: 1024 beside "
                                   "Gemma-2B's 2048). Its layers, heads and head dims are the prefix's.")
    denoise_steps: int = setting(5, "Euler steps from noise to a chunk (K).")
    noise_method: str = setting("flow_sde", "flow_sde or flow_noise: how a stochastic denoise step gets its "
                                            "Gaussian (docs/flow_vla.md).")
    noise_level: float = setting(0.5, "flow_sde's noise scale.")
    noise_std_min: float = setting(0.08, "flow_noise: the learned std's lower bound.")
    noise_std_max: float = setting(0.16, "flow_noise: the learned std's upper bound.")
    stochastic_steps: str = setting("one", "one: a denoise step drawn per sample is stochastic (RLinf's default); "
                                           "all: every step is.")
    stochastic_eval: bool = setting(False, "Evaluate the stochastic policy; false: the ODE, no noise after the "
                                           "start's.")
    value_pooling: str = setting("mean", "How the value head pools the prefix's last-layer states: mean, first "
                                         "or last token.")
    value_hidden: tuple[int, ...] = setting((512, 256, 128), "The value MLP's hidden widths (RLinf's).")
    value_backprop: bool = setting(False, "Let the value loss train the prefix too.")
    train_vision: bool = setting(False, "Train the vision tower and projector.")
    train_prefix: bool = setting(False, "Train the prefix's language model (RLinf trains the expert alone).")
    max_language_tokens: int = setting(64, "Instructions are cut to this many tokens.")
    dtype: str = setting("float32", "The model's dtype: float32, or bfloat16 (or float16) on a GPU.")
    lora_rank: int = setting(0, "Above 0: LoRA adapters of this rank train the prefix's language model (its own "
                                "weights frozen; train_prefix must be false); 0: no adapters.")
    lora_alpha: float = setting(16.0, "LoRA alpha.")
    lora_dropout: float = setting(0.0, "LoRA dropout (0 keeps acting and training on one distribution).")
    lora_target_modules: tuple[str, ...] = setting(("q_proj", "k_proj", "v_proj", "o_proj"),
                                                   "The layers LoRA adapts, by name.")
    lora_expert: bool = setting(False, "Adapt the action expert with LoRA too, its own weights frozen (for an "
                                       "expert that comes trained); false: the expert trains whole.")
    gradient_checkpointing: bool = setting(False, "Recompute the vision tower's, the prefix's and the expert's "
                                                  "activations in the backward pass: less memory, more compute.")
    algorithm: str = "ppo"
    chunk_size: int = 5
    learning_rate: float = 3e-4
    max_grad_norm: float = 1.0
    entropy_cost: float = 0.0  # the denoising policy's entropy has no closed form (entropy() is 0)
    epochs: int | None = 2
    minibatches: int | None = 2

    def __post_init__(self):
        super().__post_init__()
        check_choice("noise_method", self.noise_method, METHODS)
        check_choice("stochastic_steps", self.stochastic_steps, STOCHASTIC_STEPS)
        check_choice("value_pooling", self.value_pooling, VALUE_POOLINGS)
        check_choice("dtype", self.dtype, DTYPES)
        check_range("denoise_steps", self.denoise_steps, low=1)
        check_range("expert_width", self.expert_width, low=0)
        check_range("noise_std_min", self.noise_std_min, low=0, low_open=True)
        check_range("noise_std_max", self.noise_std_max, low=self.noise_std_min)
        check_range("lora_rank", self.lora_rank, low=0)
        if self.lora_rank > 0 and self.train_prefix:
            raise ValueError("lora_rank > 0 trains the prefix through adapters: set train_prefix=false with it")
        if self.lora_expert and self.lora_rank == 0:
            raise ValueError("lora_expert needs lora_rank > 0")

    def lora(self) -> LoraSpec | None:
        return (LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_target_modules)
                if self.lora_rank > 0 else None)

    def sampler(self) -> FlowSamplerConfig:
        return FlowSamplerConfig(denoise_steps=self.denoise_steps, noise_method=self.noise_method,
                                 noise_level=self.noise_level, stochastic_steps=self.stochastic_steps)


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
        raise NotImplementedError

    def model_path(self) -> str:
        return build_tiny_paligemma(self.corpus()) if self.config.model_path == "tiny" else self.config.model_path

    @property
    def action_dim(self) -> int:
        return int(np.prod(self._spaces[1].shape[1:] if self.config.chunk_size > 1 else self._spaces[1].shape))

    def make_agent(self) -> FlowVLAAgent:
        c = self.config
        state_dim = int(np.prod(self._spaces[0][self.STATE_KEY].shape))
        agent = FlowVLAAgent(
            self.model_path(), action_dim=self.action_dim, chunk_size=c.chunk_size, state_dim=state_dim,
            action_width=c.action_width, image_keys=self.IMAGE_KEYS, state_key=self.STATE_KEY,
            language_key=self.LANGUAGE_KEY, oracle_key=c.oracle_key, sampler=c.sampler(),
            expert_width=c.expert_width or None, noise_std_range=(c.noise_std_min, c.noise_std_max),
            value_pooling=c.value_pooling, value_hidden=c.value_hidden, value_backprop=c.value_backprop,
            train_vision=c.train_vision, train_prefix=c.train_prefix, stochastic_eval=c.stochastic_eval,
            max_language_tokens=c.max_language_tokens, dtype=c.dtype, lora=c.lora(), lora_expert=c.lora_expert,
            gradient_checkpointing=c.gradient_checkpointing)
        return agent

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        trainable = [p for p in params if p.requires_grad]  # the frozen prefix has no optimizer state
        return torch.optim.Adam(trainable, lr=self.config.learning_rate, eps=self.config.adam_eps,
                                betas=self.config.adam_betas(), foreach=True)

    # ----- the policy over chunks -----

    def learner_action_specs(self) -> Specs:
        c = self.config
        return (TensorSpec(CHAIN, np.dtype(np.float32), (c.denoise_steps + 1, c.chunk_size, c.action_width)),
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

    def episode_metrics(self, final_info: Mapping[str, object]) -> dict[str, float]:
        return {"success": float(final_info.get("success", 0.0))}
