"""The VLM agent's settings, in one dataclass that holds their checks.

`VLMAgent` takes one; the VLM Problems' config (`fleetrl.problems.vlm`) extends it, so
every setting here is also a flag with its help text.
"""

from __future__ import annotations

import dataclasses

from fleetrl.common.settings import check_choice, check_range, setting

DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass
class VLMAgentConfig:
    model_path: str = setting("tiny", "A local folder that transformers loads as an image-text-to-text model "
                                      "(LLaVA 1.5 or 1.6, Qwen2-VL, Qwen2.5-VL), or tiny: a small random LLaVA "
                                      "built here, for CPUs and tests. Nothing is downloaded.")
    max_new_tokens: int = setting(64, "Most tokens an answer may have (EOS included).")
    max_text_bytes: int = setting(256, "Most bytes of an answer's text sent to the actor; longer ones are cut.")
    temperature: float = setting(1.0, "Sampling temperature; log-probs are of softmax(logits / temperature).")
    top_p: float = setting(1.0, "Nucleus sampling; below 1 the sampled distribution is not the one whose "
                                "log-probs train (see docs/vlm.md).")
    lora_rank: int = setting(8, "LoRA rank on the language model's projections; 0: fine-tune the whole "
                                "language model.")
    lora_alpha: float = setting(16.0, "LoRA alpha.")
    lora_dropout: float = setting(0.0, "LoRA dropout (0 keeps acting and training on one distribution).")
    lora_target_modules: tuple[str, ...] = setting(("q_proj", "v_proj"), "The language model's modules LoRA "
                                                                         "adapts.")
    train_vision: bool = setting(False, "Also train the vision tower.")
    train_projector: bool = setting(False, "Also train the projector between vision and language.")
    gradient_checkpointing: bool = setting(False, "Recompute activations in the backward pass: less memory.")
    dtype: str = setting("float32", "The model's dtype: float32, or bfloat16 (or float16) on a GPU.")
    value_hidden: int = setting(256, "Width of the value head's hidden layers.")
    value_backprop: bool = setting(False, "Let the value loss train the model under the value head too (as "
                                          "RL4VLM); false: the head trains on the model's hidden state alone, so "
                                          "that a new value head's large early errors cannot disturb the policy.")
    greedy_eval: bool = setting(True, "Evaluate with greedy decoding; false: sample as in training (the policy "
                                      "RL4VLM's success rates describe).")

    def __post_init__(self):
        check_choice("dtype", self.dtype, DTYPES)
        check_range("temperature", self.temperature, low=0, low_open=True)
        check_range("top_p", self.top_p, low=0, high=1, low_open=True)
        check_range("max_new_tokens", self.max_new_tokens, low=2)
        check_range("lora_rank", self.lora_rank, low=0)
        check_range("value_hidden", self.value_hidden, low=1)
