"""Deterministic inference for evaluation: the same agent step as training, nothing recorded.

Eval actors' requests carry the frozen agent of their eval round (see `eval_rounds`);
requests that share an agent run as one forward pass. Each eval env keeps its recurrent
state in its own store, which records no unrolls. `fleetrl.launch.evaluate` runs this
same class in-process on a loaded checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from fleetrl.agents.base import Agent
from fleetrl.learner.inference.device_transfer import DeviceTransfer
from fleetrl.learner.inference.env_state_store import EnvStateStore
from fleetrl.learner.inference.inference_step import StepRequest, batch_requests, policy_step, split_rows
from fleetrl.problems.base import Problem


@dataclasses.dataclass
class EvalRequest:
    step: StepRequest
    agent: Agent

    def __len__(self) -> int:
        return len(self.step)


class EvalInference:
    def __init__(self, problem: Problem, store: EnvStateStore, device: torch.device, transfer: str = "auto"):
        self.problem = problem
        self.action_policy = problem.action_policy()
        self.store = store
        self.transfer = DeviceTransfer(device, transfer)
        self.env_steps = 0
        self.sent = tuple(spec.name for spec in problem.action_specs())  # what actors get of an action

    def __call__(self, requests: Sequence[EvalRequest]) -> list[dict[str, np.ndarray]]:
        replies: list[dict[str, np.ndarray]] = [{} for _ in requests]
        groups: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(id(request.agent), []).append(i)
        for members in groups.values():
            steps = [requests[i].step for i in members]
            actions = self._act(requests[members[0]].agent, steps)
            for i, reply in zip(members, split_rows(actions, steps)):
                replies[i] = reply
        return replies

    def _act(self, agent: Agent, requests: Sequence[StepRequest]) -> dict[str, np.ndarray]:
        step, obs, state = batch_requests(requests, self.store, self.transfer)
        with torch.inference_mode():
            _, new_state, actions = policy_step(self.problem, self.action_policy, agent, step, obs, state,
                                                evaluation=True)
            sent = self.transfer.to_host({name: actions[name] for name in self.sent})
        self.store.end_step(step.slots, step.run_ids, None, state, new_state, actions, step.ended)
        self.env_steps += int((~step.first).sum())
        return {name: value.numpy() for name, value in sent.items()}
