"""Test helper: a tiny, randomly initialized PaliGemma (SigLIP vision tower + Gemma), built
offline, to show that a transformers PaliGemma folder loads as pi0's prefix.

The same transformers class as a real PaliGemma (`PaliGemmaForConditionalGeneration`), with
a byte-level BPE tokenizer trained on the caller's corpus. It is saved with `save_pretrained`
and loaded back as real weights are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fleetrl.agents.hf.tiny_builds import built_once, byte_level_bpe
from fleetrl.common.extras import MissingExtra

IMAGE_TOKEN = "<image>"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", IMAGE_TOKEN)


@dataclasses.dataclass(frozen=True)
class TinyPaliGemmaConfig:
    image_size: int = 32
    patch_size: int = 8
    vision_width: int = 48
    vision_layers: int = 1
    text_width: int = 64
    text_layers: int = 2
    heads: int = 2
    head_dim: int = 32
    vocab_size: int = 320  # BPE merges on top of the 256 bytes and the special tokens
    initializer_range: float = 0.1  # 0.02 (transformers' default) trains much slower from scratch (as tiny_vlm's)
    seed: int = 0


def build_tiny_paligemma(corpus: Sequence[str], config: TinyPaliGemmaConfig = TinyPaliGemmaConfig(),
                         root: str | None = None) -> str:
    """The folder of a tiny PaliGemma whose tokenizer was trained on `corpus`, built if missing."""
    return built_once("tiny-paligemma", [dataclasses.asdict(config), list(corpus)],
                      lambda folder: _write(folder, corpus, config), root)


def _write(folder: str, corpus: Sequence[str], config: TinyPaliGemmaConfig) -> None:
    import torch

    bpe = byte_level_bpe(corpus, config.vocab_size, SPECIAL_TOKENS, "the tiny PaliGemma")
    try:
        import transformers
    except ImportError as e:
        raise MissingExtra("the tiny PaliGemma", "vlm", e) from e
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PreTrainedTokenizerFast,
        SiglipVisionConfig,
    )

    transformers.utils.logging.disable_progress_bar()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>", extra_special_tokens={"image_token": IMAGE_TOKEN})
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIAL_TOKENS}
    vision = SiglipVisionConfig(hidden_size=config.vision_width, intermediate_size=2 * config.vision_width,
                                num_hidden_layers=config.vision_layers, num_attention_heads=config.heads,
                                image_size=config.image_size, patch_size=config.patch_size, vision_use_head=False,
                                initializer_range=config.initializer_range)
    text = GemmaConfig(vocab_size=len(tokenizer), hidden_size=config.text_width,
                       intermediate_size=2 * config.text_width, num_hidden_layers=config.text_layers,
                       num_attention_heads=config.heads, num_key_value_heads=1, head_dim=config.head_dim,
                       max_position_embeddings=1024, initializer_range=config.initializer_range,
                       pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"],
                       eos_token_id=ids["<eos>"])
    paligemma = PaliGemmaConfig(vision_config=vision, text_config=text, image_token_index=ids[IMAGE_TOKEN],
                                projection_dim=config.text_width)
    paligemma.architectures = ["PaliGemmaForConditionalGeneration"]
    torch.manual_seed(config.seed)
    PaliGemmaForConditionalGeneration(paligemma).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
