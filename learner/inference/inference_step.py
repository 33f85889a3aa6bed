"""One batched inference step over the requests of many actors.

This is the learner's inference hot path, called by the batching thread: look up each
env's state, run the agent once, pick actions, record the step, and hand finished unrolls
on (to the algorithm's unroll hook, then the trainer's queue, which blocks when full: the
backpressure). Nothing is written before the forward pass has succeeded, so a batch that
fails can be retried request by request (see `inference_batcher`).

The forward pass runs under `torch.inference_mode`. The batch crosses to the model's device
once (`device_transfer`: on a GPU, written straight from the messages into one pinned buffer
and sent in one copy); the state store and the unrolls live there too, so only the actions
sent back cross to the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fleetrl.agents.base import Agent, AgentOutput, Observation, State
from fleetrl.learner.inference.device_transfer import DeviceTransfer
from fleetrl.learner.inference.env_state_store import EnvStateStore
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.losses.batch import ACTION, EXTRA, OBSERVATION, Unroll
from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.base import Problem


@dataclasses.dataclass
class StepRequest:
    """One actor's step, decoded and validated by the server. Arrays are [n, ...], and may
    be read-only views of the message's bytes."""

    slots: np.ndarray
    run_ids: np.ndarray
    observation: dict[str, np.ndarray]
    extras: dict[str, np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.slots)


@dataclasses.dataclass
class BatchedSteps:
    """Many requests' steps as one batch: the small per-env arrays joined on the host, and
    the rows the model and the store read (observations, extras, the step's rewards and
    flags) on the device, each written once into the staging buffer and sent in one copy."""

    slots: np.ndarray
    run_ids: np.ndarray
    first: np.ndarray
    ended: np.ndarray
    observation: dict[str, torch.Tensor]
    extras: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor]  # first, reward, terminated, truncated

    def __len__(self) -> int:
        return len(self.slots)

    @staticmethod
    def of(requests: Sequence[StepRequest], ids: tuple[np.ndarray, np.ndarray], first: np.ndarray,
           transfer: DeviceTransfer) -> BatchedSteps:
        """`ids`: the requests' `joined_ids`; `first`: their first flags (`EnvStateStore.lookup`),
        which travel with them."""
        slots, run_ids = ids
        terminated = np.concatenate([r.terminated for r in requests])
        truncated = np.concatenate([r.truncated for r in requests])
        blocks = {OBSERVATION + k: [r.observation[k] for r in requests] for k in requests[0].observation}
        blocks.update({EXTRA + k: [r.extras[k] for r in requests] for k in requests[0].extras})
        blocks.update(first=[first], reward=[r.reward for r in requests], terminated=[terminated],
                      truncated=[truncated])
        moved = transfer.rows_to_device(blocks)
        return BatchedSteps(
            slots=slots, run_ids=run_ids, first=first, ended=terminated | truncated,
            observation={k[len(OBSERVATION):]: v for k, v in moved.items() if k.startswith(OBSERVATION)},
            extras={k[len(EXTRA):]: v for k, v in moved.items() if k.startswith(EXTRA)},
            rows={k: moved[k] for k in ("first", "reward", "terminated", "truncated")})


def joined_ids(requests: Sequence[StepRequest]) -> tuple[np.ndarray, np.ndarray]:
    """The requests' env slots and run ids, in request order."""
    return np.concatenate([r.slots for r in requests]), np.concatenate([r.run_ids for r in requests])


def split_rows(arrays: dict[str, np.ndarray], requests: Sequence[StepRequest]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of batched `arrays`, in request order."""
    bounds = np.cumsum([0] + [len(r) for r in requests])
    return [{k: v[a:b] for k, v in arrays.items()} for a, b in zip(bounds[:-1], bounds[1:])]


def batch_requests(requests: Sequence[StepRequest], store: EnvStateStore, transfer: DeviceTransfer
                   ) -> tuple[BatchedSteps, Observation, State]:
    """The requests' steps as one batch on the device, each env's recurrent state and its
    previous action (`prev_action/<name>` beside the observation) looked up in the store."""
    ids = joined_ids(requests)
    first, state, prev_action = store.lookup(*ids)
    step = BatchedSteps.of(requests, ids, first, transfer)
    observation = {**step.observation, **{f"prev_action/{k}": v for k, v in prev_action.items()}}
    return step, observation, state


def policy_step(problem: Problem, action_policy: ActionPolicy, agent: Agent, step: BatchedSteps,
                observation: Observation, state: State, evaluation: bool = False
                ) -> tuple[AgentOutput, State, dict[str, torch.Tensor]]:
    """The forward pass and the actors' actions, for training's inference and eval's alike:
    (agent output, new state, actions). Evaluation picks the policy's deterministic action
    and hides the step's extras, so that an oracle never plays an eval episode."""
    extras = {} if evaluation else step.extras
    out, new_state = problem.agent_step(agent, observation, step.rows["first"], state, extras)
    return out, new_state, action_policy.select_actor_action(out, observation, extras, deterministic=evaluation)


class InferenceStep:
    def __init__(self, problem: Problem, agent: Agent, policy: PolicyVersion, store: EnvStateStore,
                 emit_unroll: Callable[[Unroll], bool], device: torch.device, transfer: str = "auto"):
        self.problem = problem
        self.action_policy = problem.action_policy()
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
        step, obs, state = batch_requests(requests, self.store, self.transfer)
        with self.policy.lock, torch.inference_mode():
            version = self.policy.version
            out, new_state, actions = policy_step(self.problem, self.action_policy, self.agent, step, obs, state)
            log_prob = self.action_policy.action_log_prob(out, actions)
            value = out["baseline"] if "baseline" in out else torch.zeros(len(step), device=log_prob.device)
        # The one wait for the device. Out of the lock: an optimizer step enqueued meanwhile runs
        # after this forward pass on the device's stream.
        sent = self.transfer.to_host({k: actions[k] for k in self.sent})

        record = {OBSERVATION + k: v for k, v in obs.items()}
        record.update({ACTION + k: v for k, v in actions.items()})
        record.update({EXTRA + k: v for k, v in step.extras.items()})
        record.update(step.rows, behaviour_log_prob=log_prob, behaviour_value=value,
                      policy_version=torch.full((len(step),), version, dtype=torch.int64, device=log_prob.device))
        for unroll in self.store.end_step(step.slots, step.run_ids, record, state, new_state, actions, step.ended):
            if not self.emit_unroll(unroll):
                break

        self.env_steps += int((~step.first).sum())
        self.batches += 1
        self.batch_envs += len(step)
        return split_rows({k: v.numpy() for k, v in sent.items()}, requests)
