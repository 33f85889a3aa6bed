"""GRPO's group-relative advantages: an unroll hook that scores each group's episodes.

The envs of a group (`group_size` consecutive env indices of one actor) start their k-th
episodes from the same reset seed (see `fleetrl.envs.vector`). The hook follows each env's
episodes through its unrolls, which arrive in order and overlap by one step. When every
member's k-th episode has ended, each member's score (the sum of its rewards) is
normalized within the group, A = (score - mean) / (std + 1e-6), and broadcast to all the
steps of that episode.

An unroll waits here until every transition in it has its episode's advantage, then goes
on to the trainer with the per-step extra "group_advantage". What waits is bounded by how
far a group's slowest member lags behind its fastest, and by `max_waiting_unrolls`: past it
the oldest waiting group's unrolls are dropped, with a log line (a member has stalled). A
leaving actor's unrolls are dropped.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from fleetrl.losses.batch import Unroll
from fleetrl.losses.unroll_hook import UnrollHook

GROUP_ADVANTAGE = "group_advantage"

log = logging.getLogger(__name__)


class GroupAdvantages(UnrollHook):
    def __init__(self, group_size: int, max_waiting_unrolls: int = 4096):
        if group_size < 2:
            raise ValueError(f"GRPO needs groups of at least 2 envs: set group_size > 1, got {group_size}")
        self.group_size = self.num_envs_multiple = group_size
        self.max_waiting_unrolls = max_waiting_unrolls
        self._lock = threading.Lock()
        self._next_group = 0
        self._group_of: dict[int, int] = {}  # slot -> group id
        # Per slot: the index of its current episode (-1 before the first) and its return so far.
        self._episode: dict[int, int] = {}
        self._return: dict[int, float] = {}
        self._scores: dict[tuple[int, int], dict[int, float]] = {}  # (group, episode) -> {slot: score}
        self._advantages: dict[tuple[int, int], float] = {}  # (slot, episode) -> advantage
        # With each step's episode index, and the episodes whose advantages it waits for.
        self._waiting: list[tuple[Unroll, np.ndarray, set[int]]] = []
        self._oldest: dict[int, int] = {}  # slot -> oldest episode whose advantage may still be needed
        self.dropped_unrolls = 0

    def admit(self, num_envs: int) -> str | None:
        if num_envs % self.group_size:
            return f"the handshake has num_envs = {num_envs}, not a multiple of group_size {self.group_size}"
        return None

    def actor_joined(self, slots: np.ndarray) -> None:
        with self._lock:
            for i, slot in enumerate(slots.tolist()):
                self._group_of[slot] = self._next_group + i // self.group_size
                self._episode[slot], self._return[slot] = -1, 0.0
            self._next_group += len(slots) // self.group_size

    def actor_left(self, slots: np.ndarray) -> None:
        gone = set(slots.tolist())
        with self._lock:
            kept = [w for w in self._waiting if w[0].slot not in gone]
            self.dropped_unrolls += len(self._waiting) - len(kept)
            self._waiting = kept
            groups = {self._group_of.pop(s) for s in gone if s in self._group_of}
            self._scores = {k: v for k, v in self._scores.items() if k[0] not in groups}
            self._advantages = {k: v for k, v in self._advantages.items() if k[0] not in gone}
            for slot in gone:
                self._oldest.pop(slot, None)
                self._episode.pop(slot, None)
                self._return.pop(slot, None)

    def process(self, unroll: Unroll) -> list[Unroll]:
        with self._lock:
            if unroll.slot not in self._group_of:  # its actor has left
                self.dropped_unrolls += 1
                return []
            episodes, needed, scored = self._account(unroll)
            self._waiting.append((unroll, episodes, needed))
            candidates = self._waiting if scored else self._waiting[-1:]  # only a new score frees older ones
            ready = [u for u, e, n in candidates if self._attach(u, e, n)]
            if ready:
                released = {id(u) for u in ready}
                self._waiting = [w for w in self._waiting if id(w[0]) not in released]
            while len(self._waiting) > self.max_waiting_unrolls:
                self._drop_group(self._group_of[self._waiting[0][0].slot])
            return ready

    def _drop_group(self, group: int) -> None:
        """Drops the waiting unrolls of `group`'s members: one has fallen too far behind."""
        kept = [w for w in self._waiting if self._group_of.get(w[0].slot) != group]
        dropped = len(self._waiting) - len(kept)
        self._waiting = kept
        self.dropped_unrolls += dropped
        log.warning("GRPO: dropped %d unrolls of group %d, which waited for its members' episodes past "
                    "max_waiting_unrolls=%d: one member lags far behind the others or has stalled", dropped, group,
                    self.max_waiting_unrolls)

    def _account(self, unroll: Unroll) -> tuple[np.ndarray, set[int], bool]:
        """Each step's episode index, scoring the episodes that end in the unroll, and the
        episodes its transitions need advantages of. Step 0 of a later unroll is the last
        step of the one before, already counted."""
        slot = unroll.slot
        steps = unroll.steps
        ended = steps["terminated"] | steps["truncated"]
        # One copy to the host for the three (the unroll may live on the learner's GPU).
        first, reward, ended = torch.stack([steps["first"].float(), steps["reward"], ended.float()]).cpu().numpy()
        first, ended = first.astype(bool), ended.astype(bool)
        episode, total = self._episode[slot], self._return[slot]
        episodes = np.full(len(first), episode, np.int64)
        scored = False
        for t in range(0 if unroll.index == 0 else 1, len(first)):
            episode, total = (episode + 1, 0.0) if first[t] else (episode, total + float(reward[t]))
            episodes[t] = episode
            if ended[t]:
                scored |= self._score(slot, episode, total)
        self._episode[slot], self._return[slot] = episode, total
        needed = set(episodes[:-1][~ended[:-1]].tolist())  # steps 0..T-1 that start a transition
        return episodes, needed, scored

    def _score(self, slot: int, episode: int, score: float) -> bool:
        """Records a member's score; True when that completed its group's episode."""
        key = (self._group_of[slot], episode)
        scores = self._scores.setdefault(key, {})
        scores[slot] = score
        if len(scores) < self.group_size:
            return False
        values = np.array(list(scores.values()))
        normalized = (values - values.mean()) / (values.std() + 1e-6)
        for member, advantage in zip(scores, normalized):
            self._advantages[(member, episode)] = float(advantage)
        del self._scores[key]
        return True

    def _attach(self, unroll: Unroll, episodes: np.ndarray, needed: set[int]) -> bool:
        """Adds the unroll's advantages if every transition's episode is scored."""
        slot = unroll.slot
        if any((slot, k) not in self._advantages for k in needed):
            return False
        advantages = [self._advantages.get((slot, k), 0.0) for k in episodes.tolist()]
        device = unroll.steps["reward"].device
        unroll.add_extra(GROUP_ADVANTAGE, torch.tensor(advantages, dtype=torch.float32, device=device))
        oldest = int(episodes.min())
        for k in range(self._oldest.get(slot, 0), oldest):  # in no later unroll of this slot
            self._advantages.pop((slot, k), None)
        self._oldest[slot] = max(self._oldest.get(slot, 0), oldest)
        return True
