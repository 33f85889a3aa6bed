"""One batched inference step over the requests of many actors.

This is the learner's inference hot path, called by the batching thread: look up each
env's state, run the agent once, pick actions, record the step, and hand finished unrolls
on (to the algorithm's unroll hook, then the trainer's queue, which blocks when full: the
backpressure). Nothing is written before the forward pass has succeeded, so a batch that
fails can be retried request by request (see `inference_batcher`).

The forward pass runs under `torch.inference_mode`, and the batch crosses to the model's
device and back through `device_transfer` (one pinned copy each way on a GPU).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fleetrl.agents.base import Agent
from fleetrl.learner.device_transfer import DeviceTransfer
from fleetrl.learner.env_state_store import EnvStateStore
from fleetrl.losses.batch import ACTION, EXTRA, OBSERVATION, Unroll
from fleetrl.problems.base import Problem


@dataclasses.dataclass
class StepRequest:
    """One actor's step, decoded and validated by the server. Arrays are [n, ...]."""

    slots: np.ndarray
    run_ids: np.ndarray
    observation: dict[str, np.ndarray]
    extras: dict[str, np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.slots)

    @staticmethod
    def concatenate(requests: Sequence[StepRequest]) -> StepRequest:
        """One request of all their rows, in order; a copy, so that tensors may share its
        memory (decoded messages are read-only)."""

        def cat(get) -> np.ndarray:
            return np.concatenate([get(r) for r in requests])

        first = requests[0]
        return StepRequest(
            slots=cat(lambda r: r.slots), run_ids=cat(lambda r: r.run_ids),
            observation={k: cat(lambda r: r.observation[k]) for k in first.observation},
            extras={k: cat(lambda r: r.extras[k]) for k in first.extras},
            reward=cat(lambda r: r.reward), terminated=cat(lambda r: r.terminated),
            truncated=cat(lambda r: r.truncated))


def split_rows(arrays: dict[str, np.ndarray], requests: Sequence[StepRequest]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of batched `arrays`, in request order."""
    bounds = np.cumsum([0] + [len(r) for r in requests])
    return [{k: v[a:b] for k, v in arrays.items()} for a, b in zip(bounds[:-1], bounds[1:])]


class PolicyVersion:
    """The model's version (its optimizer steps so far), and the lock that keeps inference
    from reading a half-updated model."""

    def __init__(self):
        # Reentrant: a blocking trainer holds it across an update whose steps take it again.
        self.lock = threading.RLock()
        self.version = 0


class InferenceStep:
    def __init__(self, problem: Problem, agent: Agent, policy: PolicyVersion, store: EnvStateStore,
                 emit_unroll: Callable[[Unroll], bool], device: torch.device, transfer: str = "auto"):
        self.problem = problem
        self.agent = agent
        self.policy = policy
        self.store = store
        self.emit_unroll = emit_unroll  # False: the learner is stopping
        self.transfer = DeviceTransfer(device, transfer)
        self.sent = [spec.name for spec in problem.action_specs()]  # learner_action_specs stay here
        self.env_steps = 0  # transitions: steps that are not the first of an episode
        self.batches = 0
        self.batch_envs = 0

    def __call__(self, requests: Sequence[StepRequest]) -> list[dict[str, np.ndarray]]:
        step = StepRequest.concatenate(requests)
        first, state, prev_action = self.store.lookup(step.slots, step.run_ids)
        obs = {k: torch.from_numpy(v) for k, v in step.observation.items()}
        obs.update({f"prev_action/{k}": v for k, v in prev_action.items()})
        extras = {k: torch.from_numpy(v) for k, v in step.extras.items()}
        with self.policy.lock, torch.inference_mode():
            version = self.policy.version
            device_obs, device_first, device_state, device_extras = self.transfer.to_device(
                (obs, first, state, extras))
            out, new_state = self.problem.agent_step(self.agent, device_obs, device_first, device_state, device_extras)
            actions = self.problem.select_actor_action(out, device_obs, device_extras)
            log_prob = self.problem.action_log_prob(out, actions)
            value = out["baseline"] if "baseline" in out else torch.zeros(len(step), device=log_prob.device)
            actions, log_prob, value, new_state = self.transfer.to_host((actions, log_prob, value, new_state))

        record = {OBSERVATION + k: v for k, v in obs.items()}
        record.update({ACTION + k: v for k, v in actions.items()})
        record.update({EXTRA + k: v for k, v in extras.items()})
        record.update(
            first=first,
            reward=torch.from_numpy(step.reward),
            terminated=torch.from_numpy(step.terminated),
            truncated=torch.from_numpy(step.truncated),
            behaviour_log_prob=log_prob,
            behaviour_value=value,
            policy_version=torch.full((len(step),), version, dtype=torch.int64),
        )
        ended = step.terminated | step.truncated
        for unroll in self.store.end_step(step.slots, step.run_ids, record, state, new_state, actions, ended):
            if not self.emit_unroll(unroll):
                break

        self.env_steps += int((~first).sum())
        self.batches += 1
        self.batch_envs += len(step)
        return split_rows({k: actions[k].numpy() for k in self.sent}, requests)
