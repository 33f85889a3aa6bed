"""One batched inference step over the requests of many actors.

This is the learner's inference hot path, called by the batching thread: look up each
env's state, run the agent once, pick actions, record the step, and hand finished unrolls
to the trainer's queue (which blocks when full: the backpressure).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Sequence

import numpy as np
import torch

from fleetrl.agents.base import Agent
from fleetrl.learner.env_state_store import EnvStateStore, Unroll
from fleetrl.learner.group_scores import GroupScores
from fleetrl.learner.tensor_tree import tree_to
from fleetrl.problems.base import Problem


@dataclasses.dataclass
class StepRequest:
    """One actor's step, decoded and validated by the server. Arrays are [n, ...]."""

    slots: np.ndarray
    run_ids: np.ndarray
    observation: dict[str, np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    # With action chunks only: [n, K] per-action rewards and [n] actions run.
    action_rewards: np.ndarray | None = None
    actions_executed: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.slots)


class PolicyVersion:
    """The model's version, and the lock that keeps inference from reading a half-updated model."""

    def __init__(self):
        # Reentrant: a blocking trainer holds it across an update whose steps take it again.
        self.lock = threading.RLock()
        self.version = 0


class InferenceStep:
    def __init__(self, problem: Problem, agent: Agent, policy: PolicyVersion, store: EnvStateStore,
                 emit_unroll: Callable[[Unroll], bool], device: torch.device, seed: int = 0,
                 group_scores: GroupScores | None = None):
        self.problem = problem
        self.agent = agent
        self.policy = policy
        self.store = store
        # With GRPO, finished unrolls wait in group_scores for their episodes' advantages.
        self.group_scores = group_scores
        self.emit_unroll = emit_unroll if group_scores is None else group_scores.hold
        self.device = device
        self.episode_draws = torch.Generator().manual_seed(seed)
        self.env_steps = 0  # transitions: steps that are not the first of an episode
        self.batches = 0
        self.batch_envs = 0

    @torch.no_grad()
    def __call__(self, requests: Sequence[StepRequest]) -> list[dict[str, np.ndarray]]:
        slots = np.concatenate([r.slots for r in requests])
        run_ids = np.concatenate([r.run_ids for r in requests])
        obs = {k: torch.from_numpy(np.concatenate([r.observation[k] for r in requests])) for k in requests[0].observation}
        first, state, prev_action = self.store.begin_step(slots, run_ids)
        obs.update({f"prev_action/{k}": v for k, v in prev_action.items()})
        device_obs = tree_to(obs, self.device)
        # Each episode's loss (RL or teacher forcing) is drawn when it starts, and kept.
        teacher = torch.from_numpy(self.store.teacher_forcing(slots))
        if first.any():
            teacher[first] = self.problem.draw_teacher_forcing(int(first.sum()), self.episode_draws)

        with self.policy.lock:
            version = self.policy.version
            out, new_state = self.agent.step(device_obs, first.to(self.device), tree_to(state, self.device))
            selected = self.problem.select_actor_action(out, device_obs, teacher_forcing=teacher.to(self.device))
            log_prob = self.problem.action_log_prob(out, selected)
        actions = tree_to(selected, "cpu")

        terminated = np.concatenate([r.terminated for r in requests])
        truncated = np.concatenate([r.truncated for r in requests])
        reward = np.concatenate([r.reward for r in requests])
        ended = terminated | truncated
        episode_index = (np.zeros(len(slots), np.int64) if self.group_scores is None
                         else self.group_scores.observe(slots, first.numpy(), reward, ended))
        step = {f"obs/{k}": v for k, v in obs.items()}
        step.update({f"action/{k}": v for k, v in actions.items()})
        step.update(
            first=first,
            reward=torch.from_numpy(reward),
            terminated=torch.from_numpy(terminated),
            truncated=torch.from_numpy(truncated),
            behaviour_log_prob=log_prob.cpu(),
            behaviour_value=out["baseline"].cpu() if "baseline" in out else torch.zeros(len(slots)),
            policy_version=torch.full((len(slots),), version, dtype=torch.int64),
            teacher_forcing=teacher,
            slot=torch.from_numpy(slots),
            episode_index=torch.from_numpy(episode_index),
        )
        if requests[0].action_rewards is not None:
            step["action_rewards"] = torch.from_numpy(np.concatenate([r.action_rewards for r in requests]))
            step["actions_executed"] = torch.from_numpy(np.concatenate([r.actions_executed for r in requests]))
        for unroll in self.store.end_step(slots, step, state, tree_to(new_state, "cpu"), actions, ended,
                                          teacher.numpy()):
            if not self.emit_unroll(unroll):
                break

        self.env_steps += int((~first).sum())
        self.batches += 1
        self.batch_envs += len(slots)
        bounds = np.cumsum([0] + [len(r) for r in requests])
        numpy_actions = {k: v.numpy() for k, v in actions.items()}
        return [{k: v[a:b] for k, v in numpy_actions.items()} for a, b in zip(bounds[:-1], bounds[1:])]

