"""The trainer: one optimizer step per batch of unrolls, on the model inference also uses.

Concurrency design. Inference (the batching thread) and training (this thread) share one
model. Training's forward and backward passes only read the weights, so they run while
inference runs. The only writer is `optimizer.step()`, and it runs under
`PolicyVersion.lock`, which inference also holds for its forward pass; so inference always
sees one whole version of the weights, and the version it records with each step is exact.
This keeps one copy of the weights (large models fit) and makes the lock's critical
section on the trainer side as short as an optimizer step.
"""

from __future__ import annotations

import torch

from fleetrl.agents.base import Agent
from fleetrl.learner.inference import PolicyVersion
from fleetrl.learner.unroll import UnrollBatch
from fleetrl.problems.base import Problem


class Trainer:
    def __init__(self, problem: Problem, agent: Agent, optimizer: torch.optim.Optimizer,
                 policy: PolicyVersion, device: torch.device):
        self.problem = problem
        self.agent = agent
        self.optimizer = optimizer
        self.policy = policy
        self.device = device
        self.steps = 0
        self.last_policy_lag = float("nan")

    def step(self, batch: UnrollBatch) -> dict[str, float]:
        batch = batch.to(self.device)
        loss, logs = self.problem.loss(self.agent, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.agent.parameters(), self.problem.config.max_grad_norm)
        with self.policy.lock:
            self.optimizer.step()
            lag = self.policy.version - batch.policy_version[:-1].float().mean()
            self.policy.version += 1
        self.steps += 1
        self.last_policy_lag = float(lag)
        summaries = {k: float(v) for k, v in logs.items()}
        summaries.update({
            "optim/grad_norm": float(grad_norm),
            "optim/learning_rate": self.optimizer.param_groups[0]["lr"],
            "learner/policy_lag": self.last_policy_lag,
        })
        return summaries
