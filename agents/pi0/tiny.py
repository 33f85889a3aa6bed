"""A tiny, randomly initialized pi0 or pi0.5, built offline, in openpi's checkpoint layout.

The flow VLA's `--model_path=tiny`: the same `Pi0Model` class as a real checkpoint at sizes
a CPU trains in minutes (small images, a few narrow layers), written by `save_pi0` with a
byte-level BPE tokenizer trained on the caller's corpus (the Problem's instructions), and
loaded back by `load_pi0`, the path real weights take. The folder is named by a hash of
what goes into it (`tiny_builds.built_once`), so processes that build the same one share it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fleetrl.agents.hf.tiny_builds import built_once, byte_level_bpe

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")  # <pad> is id 0, as PaliGemma's


@dataclasses.dataclass(frozen=True)
class TinyPi0Config:
    pi05: bool = False
    action_dim: int = 8  # the model's padded action width (a real pi0's is 32)
    action_horizon: int = 4
    image_size: int = 32
    patch_size: int = 8
    vision_width: int = 32
    vision_layers: int = 1
    width: int = 64
    expert_width: int = 32
    depth: int = 2
    heads: int = 2
    head_dim: int = 16
    vocab_size: int = 320  # BPE merges on top of the 256 bytes and the special tokens
    max_token_len: int = 16
    seed: int = 0


def build_tiny_pi0(corpus: Sequence[str], config: TinyPi0Config = TinyPi0Config(), root: str | None = None) -> str:
    """The folder of a tiny pi0 (or pi0.5) whose tokenizer was trained on `corpus`, built if missing."""
    return built_once("tiny-pi05" if config.pi05 else "tiny-pi0", [dataclasses.asdict(config), list(corpus)],
                      lambda folder: _write(folder, corpus, config), root)


def tiny_model_config(config: TinyPi0Config, vocab_size: int):
    from fleetrl.agents.pi0.model import GemmaSize, Pi0Config, SiglipSize

    def gemma(width: int) -> GemmaSize:
        return GemmaSize(width, config.depth, 2 * width, config.heads, 1, config.head_dim, vocab_size)

    return Pi0Config(pi05=config.pi05, paligemma=gemma(config.width), expert=gemma(config.expert_width),
                     vision=SiglipSize(config.vision_width, config.vision_layers, 2 * config.vision_width,
                                       config.heads, config.image_size, config.patch_size),
                     action_dim=config.action_dim, action_horizon=config.action_horizon,
                     max_token_len=config.max_token_len)


def _write(folder: str, corpus: Sequence[str], config: TinyPi0Config) -> None:
    import torch

    from fleetrl.agents.hf.pretrained_base import import_transformers
    from fleetrl.agents.pi0.checkpoint import save_pi0
    from fleetrl.agents.pi0.model import Pi0Model

    transformers = import_transformers("the tiny pi0")
    bpe = byte_level_bpe(corpus, config.vocab_size, SPECIAL_TOKENS, "the tiny pi0")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<bos>",
                                                     eos_token="<eos>")
    torch.manual_seed(config.seed)
    model = Pi0Model(tiny_model_config(config, len(tokenizer)))
    _initialize(model)
    save_pi0(model, folder)
    tokenizer.save_pretrained(folder)


def _initialize(model) -> None:
    """Scales that train from scratch: matrices N(0, 1/fan_in), embeddings N(0, 1/width) (a
    language token is multiplied by sqrt(width): it enters at about unit scale), biases 0."""
    import torch
    from torch import nn

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                fan_in = module.weight[0].numel()
                module.weight.normal_(0, fan_in ** -0.5)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0, module.weight.shape[1] ** -0.5)
