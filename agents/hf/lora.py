"""LoRA adapters injected in place (peft), and a merged copy for export.

`peft.inject_adapter_in_model` wraps the chosen linear layers where they stand, so a
module keeps its attribute paths (`paligemma.model.language_model...`) and its forward
signature; only the adapters' `lora_A` / `lora_B` weights train. `merged` folds them back
into plain layers, for a model folder that loads without peft.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Sequence

from torch import nn

from fleetrl.common.extras import MissingExtra


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj")


def _peft():
    try:
        import peft
    except ImportError as e:
        raise MissingExtra("LoRA", "vlm", e) from e
    return peft


def add_lora(module: nn.Module, spec: LoraSpec) -> list[str]:
    """Freezes `module` and injects adapters on its layers named by `spec.target_modules`;
    returns the adapted layers' names (a ValueError when none matched)."""
    peft = _peft()
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    targets = rf".*\.({'|'.join(spec.target_modules)})$"
    config = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=targets)
    with warnings.catch_warnings():  # peft 0.21 reads a property that transformers 5 deprecates
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        peft.inject_adapter_in_model(config, module)
    adapted = [name for name, m in module.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    if not adapted:
        raise ValueError(f"LoRA found none of {list(spec.target_modules)} in {type(module).__name__}")
    return adapted


def merged(module: nn.Module) -> nn.Module:
    """A copy of `module` with every adapter merged into its base layer and unwrapped."""
    peft = _peft()
    module = copy.deepcopy(module)
    for name, layer in list(module.named_modules()):
        if isinstance(layer, peft.tuners.lora.LoraLayer):
            layer.merge()
            parent_name, _, child = name.rpartition(".")
            setattr(module.get_submodule(parent_name) if parent_name else module, child, layer.get_base_layer())
    return module
