"""The Learner: builds the parts, serves actors, trains, and writes summaries.

Threads:
- gRPC workers, one per actor stream (`server.LearnerService`);
- the inference batcher (`inference_batcher.InferenceBatcher` calling `inference.InferenceStep`);
- a second batcher for eval actors (`eval_inference.EvalInference`), whose rounds
  (`eval_rounds.EvalRounds`) write eval/ summaries under <logdir>/eval, step = policy version;
- the monitor, which writes TensorBoard summaries and checks the stop conditions;
- the caller's thread, which runs the training loop below and writes checkpoints.

A learner started on a logdir that holds checkpoints resumes from the latest: weights,
optimizer, counters and RNG states. Its TensorBoard writers purge what the previous
process wrote after that checkpoint, so no curve steps back or repeats a step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import torch
from torch.utils import _pytree as pytree
from absl import logging as log
from torch.utils.tensorboard import SummaryWriter

from fleetrl.learner.checkpoint import CHECKPOINT_FORMAT, CheckpointDir, check_fits, load_checkpoint
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.env_state_store import EnvStateStore
from fleetrl.learner.eval_inference import EvalInference
from fleetrl.learner.eval_rounds import EvalResult, EvalRounds, frozen_copy
from fleetrl.learner.group_scores import GroupScores
from fleetrl.learner.inference import InferenceStep, PolicyVersion
from fleetrl.learner.inference_batcher import InferenceBatcher
from fleetrl.learner.metrics import EpisodeWindow, RateMeter, ScalarMeans
from fleetrl.learner.security import TokenCheck, server_credentials, server_options
from fleetrl.learner.server import LearnerService, ServedRun, learner_handler
from fleetrl.learner.trainer import Trainer
from fleetrl.learner.unroll import CHUNK_FIELDS, STEP_FIELDS
from fleetrl.learner.unroll_queue import UnrollQueue
from fleetrl.problems.base import Problem
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.auth import read_token


@dataclasses.dataclass
class RunSummary:
    reason: str
    env_steps: int
    episodes: int
    mean_episode_return: float
    trainer_steps: int
    wall_s: float
    target_reached: bool | None


class Learner:
    def __init__(self, config: LearnerConfig, problem: Problem | None = None):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.device = torch.device(config.device)
        self.problem = problem or load_problem(config.problem, config.hparams)

        self.agent = self.problem.make_agent().to(self.device)
        self.optimizer = self.problem.make_optimizer(self.agent.parameters())
        self.policy = PolicyVersion()
        self.stop = threading.Event()
        self._reason = ""

        self.store = build_state_store(self.problem, self.agent, config.unroll_length, self.device)

        self.unrolls = UnrollQueue(config.unroll_queue_size, self.stop)
        group_size = self.problem.config.group_size
        self.group_scores = GroupScores(group_size, self.unrolls.put) if group_size > 1 else None
        self.inference = InferenceStep(self.problem, self.agent, self.policy, self.store, self.unrolls.put,
                                       self.device, config.seed, self.group_scores)
        self.batcher = InferenceBatcher(
            self.inference, len, lambda: max(1, min(config.inference_batch_size, self.store.num_allocated)),
            config.inference_timeout_ms / 1000)
        self.trainer = Trainer(self.problem, self.agent, self.optimizer, self.policy, self.device,
                               config.block_inference_on_training, config.seed)

        self.eval_store = build_state_store(self.problem, self.agent, 0, self.device, record=False)
        self.eval_inference = EvalInference(self.problem, self.eval_store, self.device)
        self.eval_batcher = InferenceBatcher(
            self.eval_inference, len, lambda: max(1, min(config.inference_batch_size, self.eval_store.num_allocated)),
            config.inference_timeout_ms / 1000)
        self.eval_rounds = EvalRounds(self._eval_snapshot, self.problem.num_eval_episodes(), config.eval_interval_s,
                                      self._eval_complete)
        self._eval_lock = threading.Lock()
        self._eval_writer: SummaryWriter | None = None
        self._last_eval_step = -1
        if config.best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be max or min, got {config.best_mode!r}")
        if config.batch_size % self.trainer.minibatches:  # found now, not at the first update
            raise ValueError(f"batch_size {config.batch_size} does not split into the Problem's "
                             f"{self.trainer.minibatches} minibatches; change --batch_size or minibatches")
        self._best: float | None = None
        self.episodes = EpisodeWindow(config.return_window)
        self.scalars = ScalarMeans()
        self._env_rate = RateMeter()
        self._started = time.monotonic()
        self.checkpoints = CheckpointDir(os.path.join(config.logdir, "checkpoints"), config.keep_checkpoints)
        self.resumed_from = self._resume_or_warm_start()
        self._last_checkpoint = (time.monotonic(), self.trainer.steps)
        # (time, env steps, trainer steps, inference batches, envs inferred) at the last summary write
        self._last_counts = (self._started, self.inference.env_steps, self.trainer.steps, 0, 0)
        self._summaries_written = False

        self.service = LearnerService(ServedRun(
            problem=config.problem, hparams=dict(config.hparams),
            observation_specs=self.problem.observation_specs(), action_specs=self.problem.action_specs(), store=self.store, batcher=self.batcher, episodes=self.episodes,
            scalars=self.scalars, status=self.status, finished=self.stop, finished_reason=lambda: self._reason,
            policy_version=lambda: self.policy.version, max_envs_per_actor=config.max_envs_per_actor,
            group_scores=self.group_scores, chunk_size=self.problem.config.chunk_size,
            eval_store=self.eval_store, eval_batcher=self.eval_batcher, eval_rounds=self.eval_rounds,
            handshake_timeout_s=config.handshake_timeout_s,
        ))
        limit_bytes = config.max_message_mb * 1024 * 1024
        token = read_token(config.auth_token_file)
        self.authenticated = bool(token or config.tls_client_ca)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.max_actors + 4, thread_name_prefix="actor-stream"),
            maximum_concurrent_rpcs=config.max_actors + 4,
            # Above the service's own limit, so that it, not the transport, rejects a big message.
            options=server_options(4 * limit_bytes),
            interceptors=[TokenCheck(token, self.service.count_rejection)] if token else [],
        )
        self.server.add_generic_rpc_handlers((learner_handler(self.service, limit_bytes),))
        if config.tls_cert or config.tls_key:
            credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
            port = self.server.add_secure_port(config.bind, credentials)
        else:
            if config.tls_client_ca:
                raise ValueError("--tls_client_ca needs --tls_cert and --tls_key")
            port = self.server.add_insecure_port(config.bind)
        if port == 0 and not config.bind.startswith("unix:"):
            raise OSError(f"cannot bind the learner to {config.bind}")
        self.address = config.bind if config.bind.startswith("unix:") else f"{config.bind.rsplit(':', 1)[0]}:{port}"

    # ----- the run -----

    def run(self) -> RunSummary:
        os.makedirs(self.config.logdir, exist_ok=True)
        resumed = self.resumed_from is not None
        # purge_step: TensorBoard drops what an earlier process wrote at or after these steps.
        writer = SummaryWriter(self.config.logdir, purge_step=self.inference.env_steps if resumed else None)
        self._eval_writer = SummaryWriter(os.path.join(self.config.logdir, "eval"),
                                          purge_step=self.policy.version if resumed else None)
        self.server.start()
        self.batcher.start()
        self.eval_batcher.start()
        monitor = threading.Thread(target=self._monitor, args=(writer,), name="monitor", daemon=True)
        monitor.start()
        try:
            while not self.stop.is_set():
                batch = self.unrolls.get_batch(self.config.batch_size)
                if batch is None:
                    break
                self.scalars.add_all(self.trainer.update(batch))
                self._maybe_checkpoint()
        except BaseException as e:
            self.finish(f"error: {e!r}")
            raise
        finally:
            self.finish("stopped")
            self.batcher.stop()
            self.eval_batcher.stop()
            self.server.stop(grace=5).wait()
            monitor.join(timeout=10)
            self._write_summaries(writer)
            self.save_checkpoint()
            writer.close()
            with self._eval_lock:
                self._eval_writer.close()
        summary = self.summary()
        _write_json(os.path.join(self.config.logdir, "summary.json"), dataclasses.asdict(summary))
        return summary

    def finish(self, reason: str) -> None:
        """Ends the run: the first reason given is the one reported."""
        if not self.stop.is_set():
            self._reason = reason
            self.stop.set()

    def _monitor(self, writer: SummaryWriter) -> None:
        next_write = time.monotonic() + self.config.summary_interval_s
        while not self.stop.wait(0.25):
            self._check_stop_conditions()
            if time.monotonic() >= next_write:
                self._write_summaries(writer)
                next_write += self.config.summary_interval_s

    def _check_stop_conditions(self) -> None:
        target = self.config.target_mean_return
        if target is not None and len(self.episodes) >= self.config.return_window \
                and self.episodes.mean("return") >= target:
            self.finish(f"target reached: mean return {self.episodes.mean('return'):.1f} >= {target:g} "
                        f"over the last {self.config.return_window} episodes")
        elif self.config.total_env_steps and self.inference.env_steps >= self.config.total_env_steps:
            self.finish(f"total_env_steps reached ({self.config.total_env_steps:,})")

    # ----- checkpoints -----

    def checkpoint_state(self, model: dict[str, torch.Tensor] | None = None, with_optimizer: bool = True) -> dict:
        """Everything a resume needs, as tensors and plain values (loadable with weights_only=True)."""
        state = {
            "format": CHECKPOINT_FORMAT, "problem": self.config.problem, "hparams": dict(self.config.hparams),
            "learner_config": dataclasses.asdict(self.config),
            "model": model if model is not None else self.agent.state_dict(),
            "trainer_steps": self.trainer.steps, "policy_version": self.policy.version,
            "env_steps": self.inference.env_steps, "episodes": self.episodes.total,
            "eval_rounds": self.eval_rounds.completed, "best": self._best,
            "rng": {"torch": torch.get_rng_state(), "trainer_shuffle": self.trainer.shuffle_generator.get_state(),
                    "episode_draws": self.inference.episode_draws.get_state()},
        }
        if with_optimizer:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def save_checkpoint(self) -> str:
        path = self.checkpoints.save(self.checkpoint_state())
        self._last_checkpoint = (time.monotonic(), self.trainer.steps)
        return path

    def _maybe_checkpoint(self) -> None:
        last_time, last_steps = self._last_checkpoint
        by_time = self.config.checkpoint_interval_s and time.monotonic() - last_time >= self.config.checkpoint_interval_s
        by_steps = (self.config.checkpoint_every_steps
                    and self.trainer.steps - last_steps >= self.config.checkpoint_every_steps)
        if by_time or by_steps:
            self.save_checkpoint()

    def _resume_or_warm_start(self) -> str | None:
        """Resumes from the logdir's latest checkpoint; else loads --init_checkpoint's weights."""
        latest = self.checkpoints.latest()
        if latest is None:
            if self.config.init_checkpoint:
                checkpoint = load_checkpoint(self.config.init_checkpoint, self.device)
                check_fits(checkpoint, self.config.problem, self.agent, self.config.init_checkpoint)
                self.agent.load_state_dict(checkpoint["model"])
                log.info("warm start from the weights of %s", self.config.init_checkpoint)
            return None
        checkpoint = load_checkpoint(latest, self.device)
        check_fits(checkpoint, self.config.problem, self.agent, latest)
        if "optimizer" not in checkpoint:
            raise ValueError(f"{latest} holds no optimizer state and cannot resume a run")
        self.agent.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.trainer.steps = checkpoint["trainer_steps"]
        self.policy.version = checkpoint["policy_version"]
        self.inference.env_steps = checkpoint["env_steps"]
        self.episodes.total = checkpoint["episodes"]
        self.eval_rounds.resume(checkpoint["eval_rounds"])
        self._best = checkpoint["best"]
        torch.set_rng_state(checkpoint["rng"]["torch"])
        self.trainer.shuffle_generator.set_state(checkpoint["rng"]["trainer_shuffle"])
        self.inference.episode_draws.set_state(checkpoint["rng"]["episode_draws"])
        log.info("resumed from %s: %s env steps, %s trainer steps", latest, f"{self.inference.env_steps:,}",
                 f"{self.trainer.steps:,}")
        return latest

    # ----- evaluation -----

    def _eval_snapshot(self) -> tuple[torch.nn.Module, int]:
        with self.policy.lock:
            return frozen_copy(self.agent), self.policy.version

    def _eval_complete(self, result: EvalResult) -> None:
        """A whole eval round is in: summaries at its policy version, eval.jsonl, and best.pt."""
        record = {"round": result.round, "policy_version": result.policy_version, "episodes": result.episodes,
                  "trainer_steps": self.trainer.steps, "env_steps": self.inference.env_steps, **result.metrics}
        value = result.metrics.get(self.config.best_metric)
        with self._eval_lock:
            # Rounds overlapping with stragglers may finish out of order; TensorBoard's step
            # axis only moves forward (eval.jsonl keeps every round).
            if self._eval_writer is not None and result.policy_version > self._last_eval_step:
                self._last_eval_step = result.policy_version
                for name, mean in result.metrics.items():
                    tag = f"eval/episode_{name}" if name in ("return", "length") else f"eval/{name}"
                    self._eval_writer.add_scalar(tag, mean, global_step=result.policy_version)
                for tag, image in result.images.items():
                    self._eval_writer.add_image(f"eval/{tag}", image, global_step=result.policy_version,
                                                dataformats="HWC")
                self._eval_writer.flush()
            with open(os.path.join(self.config.logdir, "eval.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")
            better = value is not None and (self._best is None or (
                value > self._best if self.config.best_mode == "max" else value < self._best))
            if better:
                self._best = value
                best = self.checkpoint_state(model=result.agent.state_dict(), with_optimizer=False)
                best.update(policy_version=result.policy_version, eval_metrics=result.metrics)
                self.checkpoints.save_best(best)
        log.info("eval round %d at policy version %d: %s%s", result.round, result.policy_version,
                 ", ".join(f"{k} {v:.3g}" for k, v in sorted(result.metrics.items())), " (best)" if better else "")

    # ----- observability -----

    def _write_summaries(self, writer: SummaryWriter) -> None:
        now = time.monotonic()
        t0, steps0, train0, batches0, envs0 = self._last_counts
        steps, train = self.inference.env_steps, self.trainer.steps
        if steps == steps0 and self._summaries_written:
            return  # the step axis is env steps: writing again at the same one would repeat a step
        self._summaries_written = True
        batches, envs = self.inference.batches, self.inference.batch_envs
        self._last_counts = (now, steps, train, batches, envs)
        elapsed = max(now - t0, 1e-9)
        scalars = self.scalars.drain()
        scalars.update({
            "throughput/env_steps_per_s": (steps - steps0) / elapsed,
            "throughput/learner_steps_per_s": (train - train0) / elapsed,
            "learner/unroll_queue_size": self.unrolls.qsize(),
            "learner/connected_actors": self.service.connected_actors,
            "learner/dropped_partial_unrolls": self.store.dropped_partial_unrolls,
            "learner/rejected_messages": self.service.rejected_messages,
            "learner/policy_version": self.policy.version,
        })
        if batches > batches0:
            scalars["inference/mean_batch_size"] = (envs - envs0) / (batches - batches0)
        for tag, value in scalars.items():
            if math.isfinite(value):
                writer.add_scalar(tag, value, global_step=steps)
        writer.flush()

    def status(self) -> pb.Status:
        steps = self.inference.env_steps
        last_eval = self.eval_rounds.last
        return pb.Status(
            env_steps=steps, env_steps_per_s=self._env_rate.rate(steps), episodes=self.episodes.total,
            mean_episode_return=self.episodes.mean("return"), policy_lag=self.trainer.last_policy_lag,
            trainer_steps=self.trainer.steps, connected_actors=self.service.connected_actors,
            finished=self.stop.is_set(), finished_reason=self._reason, uptime_s=time.monotonic() - self._started,
            mean_inference_batch_size=self.inference.batch_envs / max(self.inference.batches, 1),
            eval_policy_version=last_eval.policy_version if last_eval else 0,
            eval_mean_return=last_eval.metrics.get("return", math.nan) if last_eval else math.nan,
            eval_rounds=self.eval_rounds.completed,
        )

    def summary(self) -> RunSummary:
        mean_return = self.episodes.mean("return")
        target = self.config.target_mean_return
        return RunSummary(
            reason=self._reason, env_steps=self.inference.env_steps, episodes=self.episodes.total,
            mean_episode_return=mean_return, trainer_steps=self.trainer.steps,
            wall_s=time.monotonic() - self._started,
            target_reached=None if target is None else self._reason.startswith("target reached"),
        )


def build_state_store(problem: Problem, agent: torch.nn.Module, unroll_length: int,
                      device: torch.device, record: bool = True) -> EnvStateStore:
    """The state store for `problem`'s observations and actions and `agent`'s recurrent state;
    with `record` False (eval envs) it keeps states only, no unrolls."""
    obs_fields = {s.name: (_torch_dtype(s.dtype), s.shape) for s in problem.observation_specs()}
    action_fields = {s.name: (_torch_dtype(s.dtype), s.shape) for s in problem.action_specs()}
    obs_fields.update({f"prev_action/{k}": v for k, v in action_fields.items()})
    example = {k: torch.zeros((1, *shape), dtype=dtype, device=device) for k, (dtype, shape) in obs_fields.items()}
    with torch.no_grad():
        state = agent.initial_state(example)
        state_template = pytree.tree_map(lambda x: x.cpu(), state)
        # One dry step: the per-env shape of the log-probs (unreduced with action chunks)
        # and of the value, and an early, clear failure if agent and Problem disagree.
        out, _ = agent.step(example, torch.ones(1, dtype=torch.bool, device=device), state)
        log_prob = problem.action_log_prob(out, problem.select_actor_action(out, example))
    if not record:
        return EnvStateStore(unroll_length, {}, action_fields, state_template)
    step_fields = {f"obs/{k}": v for k, v in obs_fields.items()}
    step_fields.update({f"action/{k}": v for k, v in action_fields.items()})
    step_fields.update({k: (dtype, ()) for k, dtype in STEP_FIELDS.items()})
    step_fields["behaviour_log_prob"] = (torch.float32, tuple(log_prob.shape[1:]))
    if problem.config.chunk_size > 1:
        step_fields.update({k: (dtype, (problem.config.chunk_size,) if k == "action_rewards" else ())
                            for k, dtype in CHUNK_FIELDS.items()})
    return EnvStateStore(unroll_length, step_fields, action_fields, state_template)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)
