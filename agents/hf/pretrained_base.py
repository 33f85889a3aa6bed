"""Checkpoints of agents built on a pretrained model: what trained, never the frozen base.

An agent that fine-tunes a large pretrained model (the VLM agent's image-text-to-text
model, the flow VLA's PaliGemma prefix) keeps that model under one attribute, `BASE`. Its
`state_dict` holds every parameter outside the base (heads, adapters' wrappers, an action
expert), the base's parameters that train (LoRA adapters, unfrozen parts), and a
fingerprint of the base model's config, so a checkpoint stays small and refuses, by name,
to load onto another base model.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from fleetrl.common.extras import MissingExtra


def import_transformers(what: str):
    """transformers, its progress bars off; a MissingExtra naming `what` (and the vlm extra)
    when it is not installed."""
    try:
        import transformers
    except ImportError as e:
        raise MissingExtra(what, "vlm", e) from e
    transformers.utils.logging.disable_progress_bar()
    return transformers


def check_model_folder(model_path: str, architecture_of: Callable[[str], str], supported: Sequence[str],
                       what: str) -> None:
    """Raises ValueError, naming it, unless `model_path` is a local model folder (with
    config.json) whose architecture is one of `supported`. Nothing is ever downloaded."""
    if not os.path.isdir(model_path) or not os.path.isfile(os.path.join(model_path, "config.json")):
        raise ValueError(f"--model_path={model_path}: no model there (a folder with config.json, as "
                         f"save_pretrained writes; nothing is downloaded); or use --model_path=tiny")
    architecture = architecture_of(model_path)
    if architecture not in supported:
        raise ValueError(f"--model_path={model_path} holds a {architecture}; {what} supports {', '.join(supported)}")


def fingerprint(model_path: str) -> torch.Tensor:
    """SHA-256 of the base model's config, as 32 uint8."""
    with open(os.path.join(model_path, "config.json"), "rb") as f:
        config = json.load(f)
    config.pop("transformers_version", None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).digest()
    return torch.tensor(list(digest), dtype=torch.uint8)


class PretrainedBase:
    """Mixin for an `nn.Module` agent; put it before `Agent` in the bases. The subclass sets
    `BASE` (the attribute holding the pretrained model), registers the buffer
    `base_fingerprint` (`fingerprint(model_path)`; `model_path` names the base in errors),
    and calls `remember_what_trains` at the end of its `__init__`."""

    BASE: ClassVar[str] = ""
    model_path: str

    def remember_what_trains(self) -> None:
        """Fixes the parameters a checkpoint keeps to those that train now: an eval snapshot
        (`fleetrl.learner.evaluation.eval_rounds.frozen_copy`), whose parameters train no more, must
        still save them into best.pt."""
        self._trained_names = frozenset(name for name, p in self.named_parameters() if p.requires_grad)

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        full = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        base = f"{self.BASE}."
        trained = getattr(self, "_trained_names", None)
        kept = {prefix + name for name, p in self.named_parameters()
                if (name in trained if trained is not None else p.requires_grad) or not name.startswith(base)}
        kept.add(prefix + "base_fingerprint")
        return type(full)((k, v) for k, v in full.items() if k in kept)

    def check_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        saved = state_dict.get("base_fingerprint")
        if saved is None:
            raise ValueError(f"these weights name no base model (no base_fingerprint): they are not a "
                             f"{type(self).__name__}'s")
        if not torch.equal(saved.cpu(), self.base_fingerprint.cpu()):
            raise ValueError(f"these weights were trained on another base model (config fingerprint "
                             f"{bytes(saved.tolist()).hex()[:12]}) than {self.model_path} "
                             f"({bytes(self.base_fingerprint.tolist()).hex()[:12]}): load the base model they "
                             f"were trained on")

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        self.check_weights(state_dict)
        expected = set(self.state_dict())
        if strict and set(state_dict) != expected:
            raise ValueError(f"the weights do not fit the agent: missing {sorted(expected - set(state_dict))}, "
                             f"unexpected {sorted(set(state_dict) - expected)}")
        return super().load_state_dict(state_dict, strict=False, assign=assign)
