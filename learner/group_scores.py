"""GRPO's group-relative advantages, computed on the learner as episodes end.

The envs of a group (consecutive env indices of one actor, `group_size` of them) start
their k-th episodes from the same reset seed (see `fleetrl.envs.vector`). When every
member's k-th episode has ended, each member's score (the sum of its rewards) is
normalized within the group, A = (score - mean) / (std + 1e-6), and broadcast to all the
steps of that episode.

Unrolls wait here until every transition in them has its episode's advantage, then go on
to the trainer with a "group_advantage" field. What waits is bounded by how far a group's
slowest member lags behind its fastest; a disconnecting actor's waiting unrolls are dropped.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch

from fleetrl.learner.env_state_store import Unroll


class GroupScores:
    def __init__(self, group_size: int, emit: Callable[[Unroll], bool]):
        self.group_size = group_size
        self._emit = emit
        self._lock = threading.Lock()
        self._next_group = 0
        self._group_of: dict[int, int] = {}  # slot -> group id
        # Per slot, indexed by slot: the index and the return so far of its current episode.
        self._episode = np.zeros(0, np.int64)
        self._return = np.zeros(0, np.float64)
        self._scores: dict[tuple[int, int], dict[int, float]] = {}  # (group, episode) -> {slot: score}
        self._advantages: dict[tuple[int, int], float] = {}  # (slot, episode) -> advantage
        self._waiting: list[Unroll] = []
        self._oldest: dict[int, int] = {}  # slot -> oldest episode whose advantage may still be kept
        self.dropped_unrolls = 0

    def add_actor(self, slots: np.ndarray) -> None:
        """Groups an actor's slots, in env-index order."""
        with self._lock:
            if slots.max() >= len(self._episode):
                grow = int(slots.max()) + 1 - len(self._episode)
                self._episode = np.concatenate([self._episode, np.zeros(grow, np.int64)])
                self._return = np.concatenate([self._return, np.zeros(grow)])
            for i, slot in enumerate(slots.tolist()):
                self._group_of[slot] = self._next_group + i // self.group_size
            self._episode[slots], self._return[slots] = -1, 0.0
            self._next_group += len(slots) // self.group_size

    def remove_actor(self, slots: np.ndarray) -> None:
        gone = set(slots.tolist())
        with self._lock:
            kept = [u for u in self._waiting if int(u[0]["slot"][0]) not in gone]
            self.dropped_unrolls += len(self._waiting) - len(kept)
            self._waiting = kept
            groups = {self._group_of.pop(s) for s in gone if s in self._group_of}
            self._scores = {k: v for k, v in self._scores.items() if k[0] not in groups}
            self._advantages = {k: v for k, v in self._advantages.items() if k[0] not in gone}
            for slot in gone:
                self._oldest.pop(slot, None)

    def observe(self, slots: np.ndarray, first: np.ndarray, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """Accounts for one step of `slots`; returns the episode index of each step."""
        scored = False
        with self._lock:
            self._episode[slots] += first
            self._return[slots] = np.where(first, 0.0, self._return[slots] + reward)
            episodes = self._episode[slots]
            for slot in slots[ended].tolist():
                scored |= self._score(slot, int(self._episode[slot]), float(self._return[slot]))
        if scored:  # only a newly scored group can release waiting unrolls
            self._release()
        return episodes

    def hold(self, unroll: Unroll) -> bool:
        with self._lock:
            if not self._attach(unroll):
                self._waiting.append(unroll)
                return True
        return self._emit(unroll)

    def _score(self, slot: int, episode: int, score: float) -> bool:
        """Records a member's score; True when that completed its group's episode."""
        key = (self._group_of[slot], int(episode))
        scores = self._scores.setdefault(key, {})
        scores[slot] = score
        if len(scores) == self.group_size:
            values = np.array(list(scores.values()))
            normalized = (values - values.mean()) / (values.std() + 1e-6)
            for member, advantage in zip(scores, normalized):
                self._advantages[(member, key[1])] = float(advantage)
            del self._scores[key]
            return True
        return False

    def _release(self) -> bool:
        with self._lock:
            ready, waiting = [], []
            for unroll in self._waiting:
                (ready if self._attach(unroll) else waiting).append(unroll)
            self._waiting = waiting
        return all([self._emit(unroll) for unroll in ready])

    def _attach(self, unroll: Unroll) -> bool:
        """Fills in the unroll's advantages if all its transitions' episodes are scored."""
        fields = unroll[0]
        slot = int(fields["slot"][0])
        episodes = fields["episode_index"].tolist()
        transition = ~(fields["terminated"] | fields["truncated"])[:-1]  # steps 0..T-1 that start one
        needed = {episodes[t] for t in range(len(transition)) if transition[t]}
        if any((slot, k) not in self._advantages for k in needed):
            return False
        fields["group_advantage"] = torch.tensor(
            [self._advantages.get((slot, k), 0.0) for k in episodes], dtype=torch.float32)
        for k in range(self._oldest.get(slot, 0), min(episodes)):  # in no later unroll of this slot
            self._advantages.pop((slot, k), None)
        self._oldest[slot] = max(self._oldest.get(slot, 0), min(episodes))
        return True
