"""The flow-VLA agent's settings, in one dataclass that holds their checks.

`FlowVLAAgent` takes one; the flow-VLA Problems' config (`fleetrl.problems.flow_vla`)
extends it, so every setting here is also a flag with its help text.
"""

from __future__ import annotations

import dataclasses

from fleetrl.agents.hf.lora import LoraSpec
from fleetrl.agents.pi0.model import ATTENTION_KERNELS
from fleetrl.agents.pi0.sampler import METHODS, REDUCTIONS, STOCHASTIC_STEPS, FlowSamplerConfig
from fleetrl.common.settings import check_choice, check_range, setting

VALUE_POOLINGS = ("mean", "first", "last")
VALUE_INPUTS = ("expert", "prefix")
VARIANTS = ("pi0", "pi05")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass
class FlowVLAAgentConfig:
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
    # Read by the agent too; in a Problem's config, the ProblemConfig fields of these names.
    chunk_size: int = 5
    oracle_key: str = "oracle_action"

    def __post_init__(self):
        check_choice("noise_method", self.noise_method, METHODS)
        check_choice("stochastic_steps", self.stochastic_steps, STOCHASTIC_STEPS)
        check_choice("value_pooling", self.value_pooling, VALUE_POOLINGS)
        check_choice("variant", self.variant, VARIANTS)
        check_choice("log_prob_reduction", self.log_prob_reduction, REDUCTIONS)
        if self.value_input:
            check_choice("value_input", self.value_input, VALUE_INPUTS)
        check_range("action_horizon", self.action_horizon, low=0)
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
