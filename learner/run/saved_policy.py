"""A checkpoint's policy, ready to play: its Problem rebuilt from the run's hparams and its
agent holding the saved weights. What launch.evaluate and the benchmarks load."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from fleetrl.agents.base import Agent
from fleetrl.learner.run.checkpoint import check_fits, load_checkpoint, resolve_checkpoint
from fleetrl.problems.base import Problem
from fleetrl.problems.registry import load_problem, names_a_base_of, problem_class, trusted_problem_class


@dataclasses.dataclass
class SavedPolicy:
    path: str  # the checkpoint file
    checkpoint: dict[str, Any]
    problem: Problem
    hparams: dict[str, str]  # the Problem's: the run's, with the caller's over them
    agent: Agent  # the saved weights, in eval mode

    def source(self) -> str:
        """What the agent's weights are, in words: the checkpoint, a pretrained model, or none."""
        if self.path:
            return self.path
        model_path = getattr(self.problem.config, "model_path", "")
        if model_path == "tiny":
            return "a tiny randomly initialised model (model_path=tiny: no checkpoint, nothing pretrained)"
        if model_path:
            return f"the pretrained weights at {model_path} (no fleetrl checkpoint)"
        return "a randomly initialised agent (no checkpoint, no model_path)"


def load_policy(checkpoint: str, hparams: Mapping[str, str] | None = None, problem: str | None = None,
                device: str | torch.device = "cpu", any_problem: bool = False) -> SavedPolicy:
    """The policy of `checkpoint` (a file, or a run's logdir: its best.pt, else its latest).

    The Problem is the checkpoint's, or `problem`; it takes the run's hparams (when it is the
    checkpoint's Problem or a subclass of it, say one that only renders) with `hparams` over
    them. A subclass plays the weights if they fit; with `any_problem`, so does any other
    Problem (another Problem's config does not apply). Raises CheckpointError (a ValueError)
    naming what does not fit."""
    path = resolve_checkpoint(checkpoint)
    saved = load_checkpoint(path, device)
    if not problem:  # the checkpoint's word for it: only a registered name is imported
        trusted_problem_class(saved["problem"], f"checkpoint {path}")
    name = problem or saved["problem"]
    own = name == saved["problem"] or names_a_base_of(problem_class(name), saved["problem"])
    merged = {**(saved["hparams"] if own else {}), **(hparams or {})}
    loaded = load_problem(name, merged)
    agent = loaded.make_agent().to(device)
    check_fits(saved, name, agent, path, other_problem=own or any_problem, other_problem_flag="--allow_other_problem")
    agent.load_state_dict(saved["model"])
    agent.eval()
    return SavedPolicy(path, saved, loaded, merged, agent)


def pretrained_policy(problem: str, hparams: Mapping[str, str] | None = None,
                      device: str | torch.device = "cpu") -> SavedPolicy:
    """`problem`'s agent as `make_agent` builds it, no fleetrl checkpoint: a pretrained model
    that its hparams name (a flow VLA's `model_path`, an openpi checkpoint) played as is, or
    else a randomly initialised one (`SavedPolicy.source` says which)."""
    loaded = load_problem(problem, dict(hparams or {}))
    agent = loaded.make_agent().to(device).eval()
    return SavedPolicy("", {"problem": problem, "policy_version": 0}, loaded, dict(hparams or {}), agent)
