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
from fleetrl.agents.hf.lora import LoraSpec
from fleetrl.agents.pi0.flow_vla_agent import VALUE_INPUTS, VALUE_POOLINGS, VARIANTS, FlowVLAAgent, chunk_shape
from fleetrl.agents.pi0.model import ATTENTION_KERNELS
from fleetrl.agents.pi0.sampler import METHODS, REDUCTIONS, STOCHASTIC_STEPS, FlowSamplerConfig
from fleetrl.agents.pi0.tiny import TinyPi0Config, build_tiny_pi0
from fleetrl.common.settings import check_choice, check_range, setting
from fleetrl.envs.teacher_forcing import TEACHER_FORCING
from fleetrl.problems.base import Problem, ProblemConfig
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults
from fleetrl.proto.tensors import Specs, TensorSpec

CHAIN, STOCHASTIC = "chain", "stochastic"  # the learner-side action fields
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass
class FlowVLAConfig(ProblemConfig):
    model_path: str = setting("tiny", "A pi0 or pi0.5 checkpoint folder (openpi's PyTorch layout, LeRobot's or "
                                      "RLinf's), a transformers PaliGemma folder (its prefix, a fresh expert), or "
                                      "tiny: a small random pi0 built here, for CPUs and tests. Nothing is "
                                      "downloaded.")
    tokenizer_path: str = setting("", "A local PaliGemma tokenizer folder, for a checkpoint that holds none "
                                      "(openpi's do not); empty: the model folder's.")
    asset_id: str = setting("", "Which norm_stats.json of the checkpoint (e.g. physical-intelligence/libero); "
                                "empty: its only one.")
    variant: str = setting("pi0", "pi0 or pi05: the model built for tiny or on a PaliGemma (a checkpoint's own is "
                                  "read from its weights).")
    action_width: int = setting(32, "tiny and a PaliGemma base: the model's action width (pi0's 32); the task's "
                                    "dims are its first, the rest carry noise and are never scored.")
    action_horizon: int = setting(0, "tiny and a PaliGemma base: the actions a chunk denoises (H); 0: chunk_size. "
                                     "A checkpoint's own is read from it (pi0_libero 50, pi05_libero 10).")
    expert_width: int = setting(0, "A PaliGemma base: the fresh action expert's width; 0: half the prefix's (pi0: "
                                   "1024 beside Gemma-2B's 2048). Its layers, heads and head dims are the prefix's.")
    max_token_len: int = setting(0, "Prompt tokens (padded or cut); 0: the checkpoint's, else 48 for pi0 and 200 "
                                    "for pi0.5.")
    discrete_state_input: bool = setting(False, "pi0.5: write the discretized state into the prompt (openpi's "
                                                "pi05_libero does not).")
    delta_action_dims: int = setting(0, "Add the env state's first this many dims to the actions (pi0_libero's "
                                        "delta actions: 6).")
    denoise_steps: int = setting(4, "Euler steps from noise to a chunk (K; RLinf's LIBERO configs: 4 for pi0, "
                                    "3-5 for pi0.5).")
    noise_method: str = setting("flow_sde", "flow_sde or flow_noise: how a stochastic denoise step gets its "
                                            "Gaussian (docs/flow_vla.md).")
    noise_level: float = setting(0.5, "flow_sde's noise scale (RLinf's LIBERO configs: 0.5).")
    noise_std_min: float = setting(0.08, "flow_noise: the learned std's lower bound.")
    noise_std_max: float = setting(0.16, "flow_noise: the learned std's upper bound.")
    stochastic_steps: str = setting("one", "one: a denoise step drawn per sample is stochastic (RLinf's default); "
                                           "all: every step is.")
    log_prob_reduction: str = setting("sum", "sum: a chunk's log-prob sums its stochastic steps'; mean: RLinf's "
                                             "joint log-prob, their mean with the start noise's (docs/flow_vla.md).")
    stochastic_eval: bool = setting(False, "Evaluate the stochastic policy; false: the ODE, no noise after the "
                                           "start's.")
    value_input: str = setting("", "What the value head reads: expert (the mean of the expert's action-token "
                                   "states at the stochastic step, detached) or prefix (the pooled prefix); empty: "
                                   "pi0 expert, pi0.5 prefix, as RLinf's.")
    value_pooling: str = setting("mean", "value_input=prefix: pool the prefix's last states by mean, first or last "
                                         "token.")
    value_hidden: tuple[int, ...] = setting((512, 256, 128), "The value MLP's hidden widths (RLinf's).")
    value_backprop: bool = setting(False, "Let the value loss train what the value head reads.")
    value_learning_rate: float = setting(0.0, "The value head's learning rate (RLinf: 1e-4 beside the policy's "
                                              "5e-6); 0: learning_rate.")
    train_expert: bool = setting(True, "Train the action expert and the projections around it.")
    train_vision: bool = setting(False, "Train the vision tower and projector.")
    train_prefix: bool = setting(False, "Train the prefix's language model (RLinf trains the expert alone).")
    dtype: str = setting("float32", "The model's dtype: float32, or bfloat16 (openpi's float32 islands kept) on a "
                                    "GPU.")
    lora_rank: int = setting(0, "Above 0: LoRA adapters of this rank train the prefix's language model (its own "
                                "weights frozen; train_prefix must be false); 0: no adapters.")
    lora_alpha: float = setting(16.0, "LoRA alpha.")
    lora_dropout: float = setting(0.0, "LoRA dropout (0 keeps acting and training on one distribution).")
    lora_target_modules: tuple[str, ...] = setting(("q_proj", "k_proj", "v_proj", "o_proj"),
                                                   "The layers LoRA adapts, by name.")
    lora_expert: bool = setting(False, "Adapt the action expert with LoRA too, its own weights frozen; false: the "
                                       "expert trains whole (train_expert).")
    gradient_checkpointing: bool = setting(False, "Recompute the prefix's and the expert's activations in the "
                                                  "backward pass: less memory, more compute.")
    attention: str = setting("sdpa", "The joint attention's kernel: sdpa (torch's fused, grouped-query "
                                     "scaled_dot_product_attention) or eager (openpi's own, per-head copies and an "
                                     "explicit float32 softmax; bench/pi0_inference_step.py compares them).")
    prompt_bucket: int = setting(8, "The prompt is cut to the batch's longest instruction, rounded up to this many "
                                    "token slots (padded slots change no output; fewer shapes for kernels to "
                                    "meet).")
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
        check_choice("variant", self.variant, VARIANTS)
        check_choice("log_prob_reduction", self.log_prob_reduction, REDUCTIONS)
        if self.value_input:
            check_choice("value_input", self.value_input, VALUE_INPUTS)
        check_range("action_horizon", self.action_horizon, low=0)
        check_range("value_learning_rate", self.value_learning_rate, low=0)
        check_range("delta_action_dims", self.delta_action_dims, low=0)
        check_choice("dtype", self.dtype, DTYPES)
        check_range("denoise_steps", self.denoise_steps, low=1)
        check_range("expert_width", self.expert_width, low=0)
        check_range("noise_std_min", self.noise_std_min, low=0, low_open=True)
        check_range("noise_std_max", self.noise_std_max, low=self.noise_std_min)
        check_range("lora_rank", self.lora_rank, low=0)
        check_choice("attention", self.attention, tuple(ATTENTION_KERNELS))
        check_range("prompt_bucket", self.prompt_bucket, low=1)
        if self.lora_rank > 0 and self.train_prefix:
            raise ValueError("lora_rank > 0 trains the prefix through adapters: set train_prefix=false with it")
        if self.lora_expert and self.lora_rank == 0:
            raise ValueError("lora_expert needs lora_rank > 0")

    def lora(self) -> LoraSpec | None:
        return (LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_target_modules)
                if self.lora_rank > 0 else None)

    def sampler(self) -> FlowSamplerConfig:
        return FlowSamplerConfig(denoise_steps=self.denoise_steps, noise_method=self.noise_method,
                                 noise_level=self.noise_level, stochastic_steps=self.stochastic_steps,
                                 log_prob_reduction=self.log_prob_reduction)


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
        c = self.config
        agent = FlowVLAAgent(
            self.model_path(), action_dim=self.action_dim, chunk_size=c.chunk_size, image_keys=self.IMAGE_KEYS,
            state_key=self.STATE_KEY, language_key=self.LANGUAGE_KEY, oracle_key=c.oracle_key, sampler=c.sampler(),
            tokenizer_path=c.tokenizer_path, asset_id=c.asset_id, variant=c.variant, action_width=c.action_width,
            action_horizon=c.action_horizon, expert_width=c.expert_width, max_token_len=c.max_token_len,
            discrete_state_input=c.discrete_state_input or None, delta_action_dims=c.delta_action_dims,
            noise_std_range=(c.noise_std_min, c.noise_std_max), value_input=c.value_input,
            value_pooling=c.value_pooling, value_hidden=c.value_hidden, value_backprop=c.value_backprop,
            train_expert=c.train_expert, train_vision=c.train_vision, train_prefix=c.train_prefix,
            stochastic_eval=c.stochastic_eval, dtype=c.dtype, lora=c.lora(), lora_expert=c.lora_expert,
            gradient_checkpointing=c.gradient_checkpointing, attention=c.attention, prompt_bucket=c.prompt_bucket)
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

    # ----- the policy over chunks -----

    def learner_action_specs(self) -> Specs:
        c = self.config
        horizon, width = chunk_shape(self.model_path(), c.action_width, c.action_horizon or c.chunk_size)
        return (TensorSpec(CHAIN, np.dtype(np.float32), (c.denoise_steps + 1, horizon, width)),
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

    def episode_metric_names(self) -> tuple[str, ...]:
        return ("success",)
