"""A tiny, randomly initialized vision-language model of a real transformers class, built offline.

`--model_path=tiny` builds one: a LLaVA (`LlavaForConditionalGeneration`) with a small CLIP
vision tower and a small Llama language model, and a byte-level BPE tokenizer trained here
on a corpus the caller gives (the Problem's prompts and its solver's answers), wrapped in
`PreTrainedTokenizerFast` with LLaVA's `<image>` token. It is saved with `save_pretrained`
and loaded back with `from_pretrained(dir)`, the path a real model's weights take, so the
whole VLM pipeline runs on any CPU without downloading anything.

The folder is named by a hash of everything that goes into it, and written aside and
renamed, so processes that build the same model at once share one copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fleetrl.agents.hf.tiny_builds import built_once, byte_level_bpe
from fleetrl.common.extras import MissingExtra

IMAGE_TOKEN = "<image>"
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", IMAGE_TOKEN)


@dataclasses.dataclass(frozen=True)
class TinyVLMConfig:
    image_size: int = 32
    patch_size: int = 8
    vision_width: int = 64
    vision_layers: int = 2
    text_width: int = 96
    text_layers: int = 2
    heads: int = 2
    vocab_size: int = 384  # BPE merges on top of the 256 bytes and the special tokens
    initializer_range: float = 0.1  # 0.02 (transformers' default) trains about ten times slower from scratch
    seed: int = 0


def build_tiny_vlm(corpus: Sequence[str], config: TinyVLMConfig = TinyVLMConfig(), root: str | None = None) -> str:
    """The folder of a tiny VLM whose tokenizer was trained on `corpus`, built if missing."""
    return built_once("tiny-vlm", [dataclasses.asdict(config), list(corpus)],
                      lambda folder: _write(folder, corpus, config), root)


def _write(folder: str, corpus: Sequence[str], config: TinyVLMConfig) -> None:
    import torch

    bpe = byte_level_bpe(corpus, config.vocab_size, SPECIAL_TOKENS, "the tiny vision-language model")
    try:
        import transformers
    except ImportError as e:
        raise MissingExtra("the tiny vision-language model", "vlm", e) from e
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    transformers.utils.logging.disable_progress_bar()

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        extra_special_tokens={"image_token": IMAGE_TOKEN})
    patches = (config.image_size // config.patch_size) ** 2
    vision = CLIPVisionConfig(hidden_size=config.vision_width, intermediate_size=2 * config.vision_width,
                              num_hidden_layers=config.vision_layers, num_attention_heads=config.heads,
                              image_size=config.image_size, patch_size=config.patch_size,
                              projection_dim=config.vision_width)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=config.text_width,
                       intermediate_size=2 * config.text_width, num_hidden_layers=config.text_layers,
                       num_attention_heads=config.heads, num_key_value_heads=config.heads,
                       max_position_embeddings=1024, initializer_range=config.initializer_range,
                       pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    vlm = LlavaConfig(vision_config=vision, text_config=text,
                      image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), image_seq_length=patches,
                      vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(config.seed)
    model = LlavaForConditionalGeneration(vlm)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    images = CLIPImageProcessorPil(size={"shortest_edge": config.image_size},
                                   crop_size={"height": config.image_size, "width": config.image_size})
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=config.patch_size,
                               num_additional_image_tokens=1, vision_feature_select_strategy="default")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
