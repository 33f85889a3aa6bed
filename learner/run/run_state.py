"""The run's state that outlives a process, and the checkpoint format that holds it.

A resume restores exactly what `checkpoint()` writes (see `checkpoint` for the files):

    format, problem, hparams, learner_config
    model, optimizer                    state_dicts (best.pt: no optimizer)
    policy_version                      optimizer steps so far: the one step counter
    env_steps, episodes, eval_rounds    counters, read from and restored to their owners
    step_ledger                         the train steps already counted (see StepLedger)
    best                                the best eval metric so far (or None)
    rng                                 torch's global state and the trainer's shuffle generator

Each counter lives where it is counted (the inference step, the episode window, the eval
rounds, the policy version); this object is the one place that knows all of them.

A checkpoint that cannot be written (a full disk, an I/O error) is logged and counted in
`failed_checkpoint_writes`, and training goes on: the write is tried again at the next
interval, and the last good checkpoint stays whole (files are written aside and renamed).

With learner ranks, every rank decides to save at the same batch (`checkpoint_due` is rank
0's, agreed in the per-batch exchange) and calls `save`: under FSDP the optimizer state is
gathered from every rank's shard. Rank 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import torch

from fleetrl.learner.accounting.metrics import EpisodeWindow
from fleetrl.learner.accounting.step_ledger import StepLedger
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.evaluation.eval_rounds import EvalRounds
from fleetrl.learner.inference.inference_step import InferenceStep
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.run.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointDir,
    CheckpointError,
    check_fits,
    load_checkpoint,
    load_fitting_weights,
    resolve_checkpoint,
)
from fleetrl.learner.training.rank_sync import RankSync
from fleetrl.learner.training.sharded import ShardedAgent

log = logging.getLogger(__name__)


class RunState:
    def __init__(self, config: LearnerConfig, agent: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 policy: PolicyVersion, inference: InferenceStep, episodes: EpisodeWindow, step_ledger: StepLedger,
                 eval_rounds: EvalRounds, shuffle_generator: torch.Generator, device: torch.device,
                 fleet: RankSync, sharded: ShardedAgent | None = None):
        self.config = config
        self.agent, self.optimizer = agent, optimizer
        self.policy, self.inference, self.episodes, self.eval_rounds = policy, inference, episodes, eval_rounds
        self.step_ledger = step_ledger
        self.shuffle_generator = shuffle_generator
        self.device = device
        self.fleet = fleet  # the counts a checkpoint holds are the whole fleet's, over every learner rank
        self.sharded = sharded  # FSDP: the optimizer state is in shards, across the ranks
        self.checkpoints = CheckpointDir(os.path.join(config.logdir, "checkpoints"), config.keep_checkpoints)
        self.best: float | None = None
        self._last_save = (time.monotonic(), 0)  # (time, policy version)
        self.failed_checkpoint_writes = 0
        # The run's wall time before this process, as its latest checkpoint had it (a resume
        # loses the time between that checkpoint and the end of the process that wrote it).
        self.earlier_wall_s = 0.0
        self._process_started = time.monotonic()

    def run_wall_s(self) -> float:
        """The run's wall time over every process that trained it, this one included."""
        return self.earlier_wall_s + time.monotonic() - self._process_started

    @property
    def env_steps(self) -> int:
        return self.fleet.counts().env_steps

    def checkpoint(self, model: dict[str, torch.Tensor] | None = None, with_optimizer: bool = True,
                   optimizer: dict | None = None, step_ledger: list[list[int]] | None = None) -> dict:
        """Everything a resume needs, as tensors and plain values (loadable with weights_only=True).
        `optimizer` and `step_ledger`: when already gathered from every learner rank."""
        state = {
            "format": CHECKPOINT_FORMAT, "problem": self.config.problem, "hparams": dict(self.config.hparams),
            "learner_config": dataclasses.asdict(self.config),
            "model": model if model is not None else self.agent.state_dict(),
            "policy_version": self.policy.version, "env_steps": self.env_steps,
            # The count before the ledger: a step taken in between is then in the ledger and not in
            # the count, so after a resume its resend is lost, never counted twice.
            "episodes": self.fleet.counts().episodes,
            # The recent-return window, so that a resumed run reports (and stops on) the mean it had.
            "return_window": self.episodes.recent(),
            "step_ledger": step_ledger if step_ledger is not None else self.step_ledger.state(),
            "learner_ranks": self.fleet.world_size,
            "eval_rounds": self.eval_rounds.completed, "best": self.best, "run_wall_s": self.run_wall_s(),
            "rng": {"torch": torch.get_rng_state(), "trainer_shuffle": self.shuffle_generator.get_state()},
        }
        if with_optimizer:
            state["optimizer"] = optimizer if optimizer is not None else self.optimizer_state()
        return state

    def optimizer_state(self) -> dict:
        """The optimizer's whole state (under FSDP a collective, whole on rank 0 only)."""
        return self.sharded.optimizer_state(self.optimizer) if self.sharded else self.optimizer.state_dict()

    def save(self, together: bool = True) -> str | None:
        """Writes a periodic checkpoint; returns its path, or None when it could not be written
        (or on ranks other than 0, which only take part in gathering it). `together`: every
        rank is saving (else rank 0 alone: its own step ledger, and no FSDP)."""
        self._last_save = (time.monotonic(), self.policy.version)  # a failed write waits for the next interval too
        optimizer = self.optimizer_state()
        # Every rank's ledger, since after a resume with another number of ranks an actor may
        # resend its step to another rank. Read after the fleet's counts, which are those of
        # the last exchange (see `checkpoint` for why that order).
        ledger = (self.fleet.gather_ledgers(self.step_ledger.state())
                  if together and self.fleet.world_size > 1 else None)
        if self.config.rank != 0:
            return None
        try:
            return self.checkpoints.save(self.checkpoint(optimizer=optimizer, step_ledger=ledger))
        except OSError as e:
            self._write_failed(f"checkpoint at policy version {self.policy.version}", e)
            return None

    def _write_failed(self, what: str, error: OSError) -> None:
        self.failed_checkpoint_writes += 1
        log.error("%s not written: %s. Training goes on and writes it again at the next interval; the last good "
                  "checkpoint is %s", what, error, self.checkpoints.latest() or "none (no checkpoint yet)")

    def checkpoint_due(self) -> bool:
        """Whether a periodic checkpoint is due (every checkpoint_interval_s and/or
        checkpoint_every_steps)."""
        last_time, last_version = self._last_save
        interval = self.config.checkpoint_interval_s
        by_time = interval and time.monotonic() - last_time >= interval
        by_steps = (self.config.checkpoint_every_steps
                    and self.policy.version - last_version >= self.config.checkpoint_every_steps)
        return bool(by_time or by_steps)

    def offer_best(self, value: float | None, model: dict[str, torch.Tensor], policy_version: int,
                   metrics: dict[str, float]) -> bool:
        """Writes best.pt with `model` if `value` of the best metric beats the best so far."""
        better = value is not None and (self.best is None or (
            value > self.best if self.config.best_mode == "max" else value < self.best))
        if better:
            best = self.checkpoint(model=model, with_optimizer=False)
            best.update(policy_version=policy_version, best=value, eval_metrics=metrics)
            try:
                self.checkpoints.save_best(best)
            except OSError as e:  # a later round that beats the old best.pt writes it
                self._write_failed(f"best.pt of policy version {policy_version}", e)
                return False
            self.best = value
        return better

    def _warm_start(self, path: str) -> None:
        checkpoint = load_checkpoint(path, self.device)
        if self.config.init_checkpoint_any_problem:
            moved = load_fitting_weights(checkpoint, self.agent, path)
            log.info("warm start from the weights of %s (problem %s): took %d tensors %s; left %d the agent has "
                     "no place for %s; kept %d the checkpoint lacks as built %s", path, checkpoint["problem"],
                     len(moved.taken), moved.taken[:8], len(moved.left), moved.left[:8], len(moved.kept),
                     moved.kept[:8])
            return
        if checkpoint["problem"] != self.config.problem:
            raise CheckpointError(f"--init_checkpoint={path} was written by problem {checkpoint['problem']!r}, not "
                                  f"{self.config.problem!r}; --init_checkpoint_any_problem takes its weights where "
                                  "their names and shapes fit")
        check_fits(checkpoint, self.config.problem, self.agent, path)
        self.agent.load_state_dict(checkpoint["model"])
        log.info("warm start from the weights of %s", path)

    def resume_or_warm_start(self) -> str | None:
        """Resumes from the logdir's latest checkpoint (returning its path); else loads only
        the weights of --init_checkpoint, if given."""
        latest = self.checkpoints.latest()
        if latest is None:
            if self.config.init_checkpoint:
                self._warm_start(resolve_checkpoint(self.config.init_checkpoint))
            return None
        checkpoint = load_checkpoint(latest, self.device)
        if checkpoint["problem"] != self.config.problem:
            raise CheckpointError(
                f"the logdir {self.config.logdir} holds a run of problem {checkpoint['problem']!r} ({latest}), and a "
                f"run resumes from its logdir: pick a new --logdir for this {self.config.problem!r} run")
        check_fits(checkpoint, self.config.problem, self.agent, latest)
        if "optimizer" not in checkpoint:
            raise CheckpointError(f"{latest} holds no optimizer state and cannot resume a run")
        self.agent.load_state_dict(checkpoint["model"])
        if self.sharded:  # every rank loads the whole state and keeps its shard
            self.sharded.load_optimizer_state(self.optimizer, checkpoint["optimizer"])
        else:
            self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.policy.version = checkpoint["policy_version"]
        self.inference.env_steps = checkpoint["env_steps"]
        self.episodes.restore(checkpoint.get("return_window", []), checkpoint["episodes"])  # absent before 12-07
        self.step_ledger.restore(checkpoint.get("step_ledger", []))  # absent from checkpoints before it
        self.eval_rounds.resume(checkpoint["eval_rounds"])
        self.best = checkpoint["best"]
        self.earlier_wall_s = checkpoint.get("run_wall_s", 0.0)  # absent before 12-08
        torch.set_rng_state(checkpoint["rng"]["torch"])
        self.shuffle_generator.set_state(checkpoint["rng"]["trainer_shuffle"])
        self.fleet.start_from(checkpoint["env_steps"], checkpoint["episodes"])
        self._last_save = (time.monotonic(), self.policy.version)
        log.info("resumed from %s: %s env steps, policy version %s", latest, f"{self.env_steps:,}",
                 f"{self.policy.version:,}")
        written_by = checkpoint.get("learner_ranks", 1)
        if written_by != self.fleet.world_size:
            log.info("the checkpoint was written by %d learner rank(s); this run has %d: every rank starts from "
                     "its weights, optimizer state and counts", written_by, self.fleet.world_size)
        return latest
