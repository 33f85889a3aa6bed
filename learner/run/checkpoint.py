"""Checkpoint files: atomic writes that a crash never breaks, and weights that load anywhere.

A checkpoint is one `torch.save`d dict of tensors and plain values only, so it loads
with `torch.load(path, weights_only=True)`: no pickled code runs when reading one. What it
holds is the run state's (`run_state.RunState`); every checkpoint has at least `format`,
`problem`, `hparams`, `policy_version` and `model`.

Files live in `<logdir>/checkpoints/`: `ckpt-<policy version>.pt` (the last K are kept) and
`best.pt` (the weights of the eval round with the best `best_metric`, no optimizer). Each
is written to a temporary name, flushed to disk, then renamed over: a crash mid-save
leaves the previous files whole, and a reader never sees half a file.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import torch

from fleetrl.agents.base import Agent
from fleetrl.common.files import atomic_write

# 2: one step counter, policy_version (format 1 also held an equal trainer_steps).
CHECKPOINT_FORMAT = 2
READABLE_FORMATS = (1, 2)
_NAME = re.compile(r"ckpt-(\d+)\.pt$")

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or does not fit this run."""


def atomic_save(obj: Any, path: str) -> None:
    atomic_write(path, lambda f: torch.save(obj, f), durable=True)


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for a file that is not a checkpoint
        raise CheckpointError(f"{path} is not a readable fleetrl checkpoint: {e}") from None
    readable = isinstance(checkpoint, dict) and checkpoint.get("format") in READABLE_FORMATS and "model" in checkpoint
    if not readable:
        raise CheckpointError(f"{path} is not a fleetrl checkpoint (formats {READABLE_FORMATS})")
    return checkpoint


def resolve_checkpoint(path: str) -> str:
    """`path` itself if it is a file; for a run's logdir (or its checkpoints/ folder), its
    best.pt if an eval round wrote one, else its latest periodic checkpoint."""
    if os.path.isfile(path):
        return path
    folder = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
    if os.path.isdir(folder):
        checkpoints = CheckpointDir(folder)
        if os.path.isfile(checkpoints.best_path):
            return checkpoints.best_path
        latest = checkpoints.latest()
        if latest is not None:
            return latest
        raise CheckpointError(f"no checkpoint in {folder}: a run writes ckpt-*.pt there as it trains and at its end")
    raise CheckpointError(f"no checkpoint file at {path}")


def check_fits(checkpoint: Mapping[str, Any], problem: str, model: torch.nn.Module, path: str,
               other_problem: bool = False, other_problem_flag: str = "") -> None:
    """Raises CheckpointError naming the mismatch if `checkpoint` cannot load into `model`.
    With `other_problem`, a checkpoint of another Problem loads if its weights fit; the
    refusal names `other_problem_flag`, the flag that allows it."""
    if checkpoint["problem"] != problem and not other_problem:
        allow = f"; {other_problem_flag} plays its weights where they fit" if other_problem_flag else ""
        raise CheckpointError(f"{path} was written by problem {checkpoint['problem']!r}, not {problem!r}{allow}")
    saved = checkpoint["model"]
    _check_agent_weights(model, saved, path)
    expected = model.state_dict()
    missing, extra = expected.keys() - saved.keys(), saved.keys() - expected.keys()
    if missing or extra:
        raise CheckpointError(f"{path} does not fit the agent: missing {_some(missing)}, unexpected {_some(extra)} "
                              f"(were the Problem's hparams the same?)")
    for name, tensor in expected.items():
        if tuple(saved[name].shape) != tuple(tensor.shape):
            raise CheckpointError(f"{path}: {name} has shape {list(saved[name].shape)} in the checkpoint and "
                                  f"{list(tensor.shape)} in the agent (were the Problem's hparams the same?)")


@dataclasses.dataclass
class WeightTransfer:
    taken: list[str]  # tensors of the checkpoint loaded into the model
    left: list[str]  # tensors of the checkpoint the model has no place for
    kept: list[str]  # tensors of the model the checkpoint lacks: as the model was built


def load_fitting_weights(checkpoint: Mapping[str, Any], model: torch.nn.Module, path: str) -> WeightTransfer:
    """Loads into `model` every tensor of `checkpoint` whose name it has, from any Problem,
    and says what it took and what it did not. Raises CheckpointError naming the tensors
    whose shapes differ, or when no name is shared."""
    saved, expected = checkpoint["model"], model.state_dict()
    _check_agent_weights(model, saved, path)
    shared = sorted(saved.keys() & expected.keys())
    misshaped = [f"{name} {list(saved[name].shape)} in the checkpoint, {list(expected[name].shape)} here"
                 for name in shared if tuple(saved[name].shape) != tuple(expected[name].shape)]
    if misshaped:
        raise CheckpointError(f"{path} (problem {checkpoint['problem']!r}) does not fit this agent: "
                              f"{'; '.join(misshaped[:4])}{' ...' if len(misshaped) > 4 else ''}")
    if not shared:
        raise CheckpointError(f"{path} (problem {checkpoint['problem']!r}) shares no tensor name with this agent: "
                              f"the checkpoint has {_some(saved.keys())}, the agent {_some(expected.keys())}")
    model.load_state_dict({name: saved[name] for name in shared}, strict=False)
    return WeightTransfer(shared, sorted(saved.keys() - expected.keys()), sorted(expected.keys() - saved.keys()))


def _check_agent_weights(model: torch.nn.Module, saved: Mapping[str, torch.Tensor], path: str) -> None:
    """An agent's own reasons to refuse weights that names and shapes do not show."""
    if isinstance(model, Agent):
        try:
            model.check_weights(saved)
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None


def _some(names, shown: int = 4) -> str:
    names = sorted(names)
    if len(names) <= shown:
        return str(names)
    return f"{len(names)} names, such as {names[:shown]}"


class CheckpointDir:
    """The checkpoints of one run: periodic ones, pruned to the last `keep`, and the best."""

    def __init__(self, directory: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be at least 1, got {keep}")
        self.directory = directory
        self.keep = keep

    @property
    def best_path(self) -> str:
        return os.path.join(self.directory, "best.pt")

    def periodic(self) -> list[str]:
        """Complete periodic checkpoints, oldest first."""
        found = []
        for path in glob.glob(os.path.join(self.directory, "ckpt-*.pt")):
            match = _NAME.search(os.path.basename(path))
            if match:
                found.append((int(match.group(1)), path))
        return [path for _, path in sorted(found)]

    def latest(self) -> str | None:
        paths = self.periodic()
        return paths[-1] if paths else None

    def save(self, checkpoint: Mapping[str, Any]) -> str:
        path = os.path.join(self.directory, f"ckpt-{checkpoint['policy_version']:010d}.pt")
        atomic_save(dict(checkpoint), path)
        for old in self.periodic()[:-self.keep]:
            try:
                os.remove(old)
            except OSError as e:  # the new checkpoint is written: one too many kept is no failure
                log.warning("could not remove the old checkpoint %s: %s", old, e)
        return path

    def save_best(self, checkpoint: Mapping[str, Any]) -> str:
        atomic_save(dict(checkpoint), self.best_path)
        return self.best_path


def export_weights(checkpoint_path: str, output_path: str) -> dict[str, Any]:
    """Writes just the model's weights, with what is needed to rebuild the agent (problem,
    hparams, policy version), loadable with `torch.load(output_path, weights_only=True)`."""
    checkpoint = load_checkpoint(checkpoint_path)
    exported = {"problem": checkpoint["problem"], "hparams": checkpoint["hparams"],
                "policy_version": checkpoint["policy_version"], "model": checkpoint["model"]}
    atomic_save(exported, output_path)
    return exported
