"""The trainer: turns each batch of unrolls into optimizer steps, on the model inference also uses.

Concurrency design. Inference (the batching thread) and training (this thread) share one
model. Training's forward and backward passes only read the weights, so they run while
inference runs. The only writer is `optimizer.step()`, and it runs under
`PolicyVersion.lock`, which inference also holds for its forward pass; so inference always
sees one whole version of the weights, and the version it records with each step is exact.
This keeps one copy of the weights (large models fit) and makes the trainer's critical
section as short as an optimizer step.

With learner ranks (`data_parallel`), each optimizer step averages the gradients over the
ranks first, and a target_kl stop reads the ranks' mean KL, so every rank takes the same
steps and keeps the same weights. With `sharded` (FSDP, `fleetrl.learner.training.sharded`), the
trainer steps a sharded twin of the agent instead, whose gradients FSDP averages, and
publishes each step's weights to inference's copy under the lock.

With `block_inference_on_training` the trainer instead holds the lock for its whole update
(every epoch and minibatch), as SEED RL's option of that name does: no action is chosen
by a policy that is half-way through an update, at the cost of idle actors meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from fleetrl.agents.base import Agent
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.data_parallel import DataParallel
from fleetrl.learner.training.sharded import ShardedAgent, whole
from fleetrl.learner.training.state_trust_region import StateTrustRegion
from fleetrl.learner.training.unroll_recorder import UnrollRecorder
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems.base import Problem


def _detached(value: torch.Tensor | float) -> torch.Tensor | float:
    return value.detach() if isinstance(value, torch.Tensor) else value


def host_values(values: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """`values` as floats, the tensors among them brought to the host in one transfer (one
    device sync, where `float()` on each would make one apiece)."""
    tensors = [name for name, value in values.items() if isinstance(value, torch.Tensor)]
    out = {name: float(value) for name, value in values.items() if not isinstance(value, torch.Tensor)}
    if tensors:
        stacked = torch.stack([values[name].reshape(()).to(torch.float32) for name in tensors])
        out.update(zip(tensors, stacked.tolist(), strict=True))
    return out


@dataclasses.dataclass
class Step:
    """One optimizer step (or one skipped): its logs, and whether the batch's updates end here."""

    logs: dict[str, float]
    ends_batch: bool = False  # target_kl skipped it, or max_state_kl shortened it
    stopped_early: bool | None = None  # whether target_kl skipped it; None: not checked


class Trainer:
    def __init__(self, problem: Problem, agent: Agent, optimizer: torch.optim.Optimizer,
                 policy: PolicyVersion, device: torch.device, block_inference_on_training: bool = False,
                 seed: int = 0, data_parallel: DataParallel | None = None, sharded: ShardedAgent | None = None,
                 recorder: UnrollRecorder | None = None):
        """`agent` is the model inference uses; with `sharded`, the trainer steps its
        sharded twin, which `optimizer` holds. `recorder` takes the first batches with the
        loss's targets (--record_unrolls)."""
        self.problem = problem
        # What the losses read of the Problem (fleetrl.losses.training_problem): its config and
        # its action policy's log-probs and entropy.
        self.action_policy = problem.action_policy()
        self.sharded = sharded
        self.agent = sharded.training if sharded else agent
        self.optimizer = optimizer
        self.policy = policy
        self.device = device
        self.block_inference = block_inference_on_training
        self.algorithm = problem.algorithm()
        self.epochs = problem.config.epochs or self.algorithm.default_epochs
        self.minibatches = problem.config.minibatches or self.algorithm.default_minibatches
        self.accumulation_steps = problem.config.accumulation_steps
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        # Agents that keep no input statistics skip the hook, and the lock it takes, each batch.
        self._keeps_statistics = type(agent).update_statistics is not Agent.update_statistics
        self._parameters = list(self.agent.parameters())  # walking the module tree each step costs more than the clip
        self.recorder = recorder
        self.data_parallel = data_parallel  # learner ranks: gradients and early stops agreed across them
        max_state_kl = problem.config.max_state_kl
        if max_state_kl is not None and data_parallel is not None and data_parallel.world_size > 1:
            raise ValueError("max_state_kl shortens each rank's step by its own states' KL, which would part the "
                             "ranks' weights: it runs with one learner rank only")
        self.trust_region = (None if max_state_kl is None
                             else StateTrustRegion(self.agent, self._parameters, max_state_kl))
        # In updates (one batch's epochs x minibatches optimizer steps): how much older the
        # policy that acted is than the one being trained, averaged over the batch's steps.
        self.last_policy_lag = float("nan")
        self.last_losses: dict[str, float] = {}  # the last batch's "loss/" logs, for the progress line

    def update(self, batch: UnrollBatch) -> dict[str, float]:
        """All epochs and minibatches of one batch; returns the mean of their logs."""
        if self.device.type != "cpu":  # batches are collated on the host
            batch = batch.to(self.device)
        if batch.batch_size % (self.minibatches * self.accumulation_steps):
            raise ValueError(f"batch_size {batch.batch_size} does not split into {self.minibatches} minibatches "
                             f"of {self.accumulation_steps} microbatches")
        steps: list[Step] = []
        with self.policy.lock if self.block_inference else contextlib.nullcontext():
            lag = self.policy.version - batch.policy_version[:-1].float().mean()
            if self.problem.config.reset_momentum_each_batch:
                self._reset_momentum()
            if self._keeps_statistics:
                with self.policy.lock:  # inference reads the statistics too; the lock is reentrant
                    self.agent.update_statistics(batch.observation)
            prepared = self.algorithm.prepare(self.action_policy, batch)
            if self.recorder is not None and self.recorder.wants_more:
                self.recorder.add(batch, self.algorithm.targets(self.action_policy, self.agent, batch, prepared),
                                  prepared["valid"])
            if self.problem.config.anchor_kl_cost > 0 or self.trust_region:
                before_logits = self._policy_logits(batch)
                if self.problem.config.anchor_kl_cost > 0:
                    prepared["anchor_logits"] = before_logits
                if self.trust_region:
                    self.trust_region.start_batch(batch, before_logits, prepared["valid"])
            for _ in range(self.epochs):
                if self.minibatches == 1:  # the whole batch: no shuffle, no copy
                    minibatches = [(batch, prepared)]
                else:
                    order = torch.randperm(batch.batch_size, generator=self.shuffle_generator).to(self.device)
                    minibatches = [(batch.select(i), {k: v[:, i] for k, v in prepared.items()})
                                   for i in order.chunk(self.minibatches)]
                for minibatch, minibatch_prepared in minibatches:
                    steps.append(self._step(minibatch, minibatch_prepared))
                    if steps[-1].ends_batch:
                        break
                if steps[-1].ends_batch:
                    break
        names = {name for step in steps for name in step.logs}
        logs = {name: sum(step.logs[name] for step in steps if name in step.logs)
                / sum(name in step.logs for step in steps) for name in names}
        if steps[-1].stopped_early is not None:  # per batch: whether --target_kl cut it short
            logs["ppo/stopped_early"] = float(steps[-1].stopped_early)
        self.last_policy_lag = float(lag) / (self.epochs * self.minibatches)
        logs["learner/policy_lag_updates"] = self.last_policy_lag
        self.last_losses = {name[len("loss/"):]: float(value) for name, value in logs.items()
                            if name.startswith("loss/")}
        return logs

    @torch.no_grad()
    def _reset_momentum(self) -> None:
        for state in self.optimizer.state.values():
            for name in ("exp_avg", "momentum_buffer"):  # Adam's and SGD's
                if isinstance(state.get(name), torch.Tensor):
                    state[name].zero_()

    @torch.no_grad()
    def _policy_logits(self, batch: UnrollBatch) -> torch.Tensor:
        """The policy before this batch's updates, on every step of it: the anchor of
        `anchor_kl_cost` and the reference of `max_state_kl`."""
        outputs, _ = self.agent.unroll(batch.observation, batch.first, batch.initial_state, batch.action)
        if "policy_logits" not in outputs:
            raise ValueError(f"anchor_kl_cost and max_state_kl need a categorical policy, but "
                             f"{type(self.agent).__name__} outputs no policy_logits (it outputs {sorted(outputs)})")
        return outputs["policy_logits"]

    def _step(self, minibatch: UnrollBatch, prepared: dict[str, torch.Tensor]) -> Step:
        """One optimizer step; with accumulation_steps > 1, its gradient is the mean of the
        microbatches', each freed after its backward pass."""
        self.optimizer.zero_grad(set_to_none=True)
        parts = self.accumulation_steps
        # The logged values stay on the device until the step is taken: one sync for them all.
        summaries: dict[str, torch.Tensor | float] = {}
        approx_kl: torch.Tensor | float | None = None
        for index in torch.arange(minibatch.batch_size, device=self.device).chunk(parts):
            micro = minibatch if parts == 1 else minibatch.select(index)
            micro_prepared = prepared if parts == 1 else {k: v[:, index] for k, v in prepared.items()}
            result = self.algorithm.loss(self.action_policy, self.agent, micro, micro_prepared)
            (result.loss if parts == 1 else result.loss / parts).backward()
            for name, value in result.logs.items():
                summaries[name] = summaries.get(name, 0.0) + _detached(value) / parts
            if result.approx_kl is not None:
                approx_kl = (approx_kl or 0.0) + _detached(result.approx_kl) / parts
        target_kl = self.problem.config.target_kl
        stopped_early = None
        if target_kl is not None and approx_kl is not None:  # a decision on the host: its own sync
            approx_kl = float(approx_kl)
            if self.data_parallel is not None:  # every rank decides on the same KL and steps on the same gradient
                approx_kl = self.data_parallel.mean(approx_kl)
            stopped_early = approx_kl > 1.5 * target_kl
        if stopped_early:  # this batch has moved the policy far enough: no step on it (SB3's check, before the step)
            return Step(host_values(summaries), ends_batch=True, stopped_early=True)
        if self.data_parallel is not None and self.sharded is None:  # FSDP averaged them in the backward pass
            self.data_parallel.average_gradients(self._parameters)
        grad_norm = whole(torch.nn.utils.clip_grad_norm_(self._parameters, self.problem.config.max_grad_norm))
        summaries.update({"optim/grad_norm": grad_norm.detach(),
                          "optim/learning_rate": self.optimizer.param_groups[0]["lr"]})
        if self.sharded is not None:
            self.optimizer.step()  # the shards, which inference never reads
            self.sharded.publish(self.policy)
            return Step(host_values(summaries), stopped_early=stopped_early)
        before_step = self.trust_region.weights() if self.trust_region else None
        shortening = None
        with self.policy.lock:  # the only writes to the weights; the version counts these steps
            self.optimizer.step()
            if before_step is not None:
                shortening = self.trust_region.enforce(before_step)
            self.policy.version += 1
        if shortening is None:
            return Step(host_values(summaries), stopped_early=stopped_early)
        return Step({**host_values(summaries), **shortening.logs()}, ends_batch=shortening.step_fraction < 1.0,
                    stopped_early=stopped_early)
