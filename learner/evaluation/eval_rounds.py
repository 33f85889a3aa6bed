"""Evaluation rounds: the learner hands eval actors episodes of a fixed eval set.

A round runs the Problem's whole eval set (episodes 0 .. eval_episodes-1, each from its
own reset, `Problem.eval_reset`) once, with one frozen snapshot of the weights: so the
round's metrics belong to exactly one policy version, and the best round's weights are
that snapshot. Eval actors pull work (`GetEvalWork`) a few episodes at a time, so fast
actors take more; the episodes of an actor that disconnects go back in the queue.

A new round starts once `interval_s` has passed since the last one started. Rounds may
overlap while stragglers finish (each with its own snapshot), up to `max_rounds_in_flight`.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fleetrl.agents.base import Agent


@dataclasses.dataclass
class EvalResult:
    """A complete round: the mean of every episode metric over the eval set."""

    round: int
    policy_version: int
    metrics: dict[str, float]
    episodes: int
    agent: Agent  # the snapshot that played it
    images: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # Problem.eval_images
    # Problem.episode_record of each episode that sent one, in episode order.
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Round:
    index: int
    version: int
    agent: Agent
    pending: collections.deque[int]
    running: dict[str, set[int]] = dataclasses.field(default_factory=dict)
    results: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    images: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    records: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Work:
    round: int = 0
    policy_version: int = 0
    episodes: list[int] = dataclasses.field(default_factory=list)
    retry_after_s: float = 0.0


class EvalRounds:
    def __init__(self, snapshot: Callable[[], tuple[Agent, int]], episodes: int, interval_s: float,
                 max_rounds_in_flight: int = 2,
                 clock: Callable[[], float] = time.monotonic):
        """`snapshot` returns a frozen copy of the agent and its policy version."""
        if episodes < 1:
            raise ValueError(f"eval_episodes must be at least 1, got {episodes}")
        self._snapshot = snapshot
        self.episodes = episodes
        self.interval_s = interval_s
        self._max_in_flight = max_rounds_in_flight
        self._clock = clock
        self._lock = threading.Lock()
        self._rounds: dict[int, _Round] = {}
        self._actor_round: dict[str, int] = {}
        # Kept past its round's end: the step that reports an actor's last episode still needs actions.
        self._actor_snapshot: dict[str, tuple[Agent, int]] = {}
        self._next_index = 0
        self._last_start = -math.inf
        self._snapshotting = False  # a new round's snapshot is being taken, outside the lock
        self.completed = 0
        self.last: EvalResult | None = None

    def work(self, actor_id: str, max_episodes: int) -> Work:
        """Up to `max_episodes` episodes for `actor_id`, which asks only when its last ones are done.

        A new round's snapshot is taken outside the lock: it waits for the policy lock, which
        a training update may hold throughout, and other actors' calls must not wait with it."""
        with self._lock:
            self._requeue(actor_id)  # anything still listed as running was lost (say, a reconnect)
            self._actor_snapshot.pop(actor_id, None)
            round_ = next((r for r in self._rounds.values() if r.pending), None)
            if round_ is None:
                wait = self._last_start + self.interval_s - self._clock()
                if wait > 0 or len(self._rounds) >= self._max_in_flight or self._snapshotting:
                    return Work(retry_after_s=min(max(wait, 0.2), 5.0))
                self._snapshotting = True
        if round_ is None:
            try:
                agent, version = self._snapshot()
            finally:
                with self._lock:
                    self._snapshotting = False
            with self._lock:
                round_ = self._start_round(agent, version)
        with self._lock:
            taken = [round_.pending.popleft() for _ in range(min(max_episodes, len(round_.pending)))]
            round_.running[actor_id] = set(taken)
            self._actor_round[actor_id] = round_.index
            self._actor_snapshot[actor_id] = (round_.agent, round_.version)
            return Work(round=round_.index, policy_version=round_.version, episodes=taken)

    def agent_for(self, actor_id: str) -> tuple[Agent, int] | None:
        """The snapshot (and its version) that `actor_id`'s current episodes run with. Lock-free
        (one dict read): eval steps ask for it on the server's event loop."""
        return self._actor_snapshot.get(actor_id)

    def record(self, actor_id: str, episode: int, metrics: dict[str, float],
               images: dict[str, np.ndarray] | None = None, record: dict[str, Any] | None = None) -> EvalResult | None:
        """An episode of `actor_id`'s current round ended with `metrics` (and pictures, and
        the Problem's record of it). Returns the round's result when this was its last episode."""
        with self._lock:
            round_ = self._rounds.get(self._actor_round.get(actor_id, -1))
            running = round_.running.get(actor_id, set()) if round_ is not None else set()
            if episode not in running:
                raise ValueError(f"eval episode {episode} was not assigned to actor {actor_id!r}")
            running.discard(episode)
            round_.results[episode] = dict(metrics)
            round_.images.update(images or {})
            if record is not None:
                round_.records[episode] = record
            if len(round_.results) < self.episodes:
                return None
            del self._rounds[round_.index]
            result = EvalResult(round=round_.index, policy_version=round_.version, episodes=self.episodes,
                                metrics=_means(round_.results.values()), agent=round_.agent, images=round_.images,
                                records=[round_.records[e] for e in sorted(round_.records)])
            self.completed += 1
            self.last = result
        return result

    def resume(self, completed_rounds: int) -> None:
        """Continues round numbering after a restart."""
        with self._lock:
            self._next_index = self.completed = completed_rounds

    def disconnect(self, actor_id: str) -> None:
        with self._lock:
            self._requeue(actor_id)
            self._actor_round.pop(actor_id, None)
            self._actor_snapshot.pop(actor_id, None)

    def _requeue(self, actor_id: str) -> None:
        for round_ in self._rounds.values():
            lost = round_.running.pop(actor_id, set())
            round_.pending.extendleft(sorted(lost, reverse=True))

    def _start_round(self, agent: Agent, version: int) -> _Round:
        round_ = _Round(index=self._next_index, version=version, agent=agent,
                        pending=collections.deque(range(self.episodes)))
        self._rounds[round_.index] = round_
        self._next_index += 1
        self._last_start = self._clock()
        return round_


def _means(episodes) -> dict[str, float]:
    sums: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    for metrics in episodes:
        for name, value in metrics.items():
            sums[name] += value
            counts[name] += 1
    return {name: sums[name] / counts[name] for name in sums}


def frozen_copy(agent: Agent) -> Agent:
    """A copy of `agent` for evaluation: its own copy of every weight that trains, and of the
    buffers (input statistics move with training); the frozen ones (a pretrained base under
    LoRA adapters, say) are shared, since no update changes them. No gradients."""
    shared = {id(p): p for p in agent.parameters() if not p.requires_grad}
    snapshot = copy.deepcopy(agent, memo=shared)
    snapshot.eval()
    for parameter in snapshot.parameters():
        parameter.requires_grad_(False)
    return snapshot
