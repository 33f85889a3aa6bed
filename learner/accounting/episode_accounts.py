"""The learner's own account of every train env's episode, and its verdict on what actors
report.

Actors report each finished episode's metrics, but a buggy env (a stale return after an
autoreset) or a hostile client can report anything, and the recent-return window feeds the
run's stop condition. So the learner counts only what it can vouch for: per env, it sums
the rewards and counts the steps it takes in, and ends an episode where the env's done flag
says so, by the actor's own rule (`actor.episode_tracker`): under next-step autoreset the
step after an episode's end is the reset of the next one and counts toward neither.

`EpisodeAccounts.step` keeps those sums per env slot, vectorized over a step's envs. An
account follows its env's run id, not its slot: an actor that reconnects gets new slots, so
a released slot's accounts are parked by run id and taken up again when the run id comes
back. A run id the learner has not seen begins its account at that step, as at a reset; if
the env was in fact mid-episode (the learner restarted, or the actor came from another
learner rank), that first episode is shorter here than the actor says, and is not counted:
the learner did not see it whole.

`vouch` sets the learner's figures against the reports of one step:
- an episode the learner ends is counted with its own return and length, and the report's
  other metrics (success, a Problem's own); a report that differs is a dispute;
- a report where the learner ended no episode, or of an episode it did not see begin, is
  unvouched and counted nowhere.

Only the serving loop (or the debug run's one thread) calls these: no lock.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from fleetrl.envs.teacher_forcing import TRAIN

# A reported return agrees with the learner's own within this share of the rewards' summed
# magnitude: rewards cross the wire as float32, and the actor sums them before rounding.
RETURN_TOLERANCE = 1e-5


class Report(Protocol):
    """A finished episode as an actor reported it (`wire_messages.Episode`)."""

    row: int  # the env's row in its step
    metrics: Mapping[str, float]
    group: str


@dataclasses.dataclass
class EndedEpisodes:
    """The episodes a step ended, by the learner's account; arrays are per ended episode."""

    rows: np.ndarray  # the step's rows (envs) whose episode ended
    returns: np.ndarray  # float64
    lengths: np.ndarray  # int64
    magnitudes: np.ndarray  # the sum of |reward|: the scale of a return's rounding
    whole: np.ndarray  # bool: the learner saw the episode begin


_NONE_ENDED = EndedEpisodes(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), np.zeros(0),
                            np.zeros(0, bool))


@dataclasses.dataclass
class Verdict:
    counted: list[tuple[str, dict[str, float]]]  # (group, metrics) of each episode the learner counts
    disputes: list[str]  # one line per disputed episode: what the actor said and what the learner saw
    unvouched: int


class EpisodeAccounts:
    def __init__(self, max_parked: int = 65_536):
        self.max_parked = max_parked
        self._run_id = np.zeros(0, np.uint64)
        self._return = np.zeros(0, np.float64)
        self._magnitude = np.zeros(0, np.float64)
        self._length = np.zeros(0, np.int64)
        self._resetting = np.zeros(0, bool)  # this slot's next step is the reset of an episode
        self._whole = np.zeros(0, bool)  # the learner saw the current episode's reset
        # run id -> (return, magnitude, length, resetting, whole) of released slots, oldest first
        self._parked: collections.OrderedDict[int, tuple[float, float, int, bool, bool]] = collections.OrderedDict()
        self.disputed = 0
        self.unvouched = 0

    def step(self, slots: np.ndarray, run_ids: np.ndarray, rewards: np.ndarray, done: np.ndarray) -> EndedEpisodes:
        """Accounts for one step of `slots`' envs; returns the episodes it ended. On the
        learner's hot path: a few vectorized operations, and fewer on a step that ends none."""
        try:
            changed = self._run_id[slots] != run_ids
        except IndexError:  # a slot beyond the accounts so far
            self._grow(int(slots.max()) + 1)
            changed = self._run_id[slots] != run_ids
        if changed.any():
            for slot, run_id in zip(slots[changed].tolist(), run_ids[changed].tolist()):
                self._take_up(slot, run_id)
        counting = ~self._resetting[slots]
        counted = rewards * counting
        self._return[slots] += counted
        self._magnitude[slots] += np.abs(counted)
        self._length[slots] += counting
        ended = done & counting
        self._resetting[slots] = ended
        if not ended.any():
            return _NONE_ENDED
        rows = np.flatnonzero(ended)
        ended_slots = slots[rows]
        episodes = EndedEpisodes(rows, self._return[ended_slots], self._length[ended_slots],
                                 self._magnitude[ended_slots], self._whole[ended_slots])
        self._return[ended_slots] = self._magnitude[ended_slots] = 0.0
        self._length[ended_slots] = 0
        self._whole[ended_slots] = True  # the learner will see the next episode's reset
        return episodes

    def release(self, slots: np.ndarray) -> None:
        """An actor's stream ended: its envs' accounts wait under their run ids for a reconnect."""
        for slot in slots.tolist():
            if slot < len(self._run_id) and self._run_id[slot]:
                self._parked[int(self._run_id[slot])] = (self._return[slot], self._magnitude[slot],
                                                         int(self._length[slot]), bool(self._resetting[slot]),
                                                         bool(self._whole[slot]))
                self._run_id[slot] = 0
        while len(self._parked) > self.max_parked:
            self._parked.popitem(last=False)

    def _take_up(self, slot: int, run_id: int) -> None:
        parked = self._parked.pop(run_id, None)
        self._run_id[slot] = run_id
        if parked is None:  # a run id not seen: this step is taken as a reset
            parked = (0.0, 0.0, 0, True, False)
        (self._return[slot], self._magnitude[slot], self._length[slot], self._resetting[slot],
         self._whole[slot]) = parked

    def _grow(self, size: int) -> None:
        size = max(size, 2 * len(self._run_id), 64)

        def grown(array: np.ndarray) -> np.ndarray:
            return np.concatenate([array, np.zeros(size - len(array), array.dtype)])

        self._run_id, self._return, self._magnitude = grown(self._run_id), grown(self._return), grown(self._magnitude)
        self._length, self._resetting, self._whole = grown(self._length), grown(self._resetting), grown(self._whole)


def vouch(ended: EndedEpisodes, reports: list[Report], env_indices: Sequence[int]) -> Verdict:
    """The episodes the learner counts from one step, and what it disputes, given the
    learner's own account `ended` and the actor's `reports` (each on a done env's row)."""
    by_row = {report.row: report for report in reports}
    counted, disputes, unvouched = [], [], 0
    for k, row in enumerate(ended.rows.tolist()):
        own = {"return": float(ended.returns[k]), "length": float(ended.lengths[k])}
        env = int(env_indices[row])
        report = by_row.pop(row, None)
        if report is None:
            disputes.append(f"env {env}: no finished episode reported (the learner's: return {own['return']:.6g}, "
                            f"length {own['length']:g})")
            counted.append((TRAIN, own))
            continue
        claimed_return, claimed_length = report.metrics.get("return"), report.metrics.get("length")
        if not ended.whole[k] and claimed_length is not None and claimed_length > own["length"]:
            unvouched += 1  # begun before the learner took this env in: it saw only the end
            continue
        tolerance = RETURN_TOLERANCE * float(ended.magnitudes[k]) + 1e-6
        if ((claimed_return is not None and abs(claimed_return - own["return"]) > tolerance)
                or (claimed_length is not None and claimed_length != own["length"])):
            disputes.append(f"env {env}: reported return {claimed_return!r}, length {claimed_length!r}; the "
                            f"learner's: return {own['return']:.6g}, length {own['length']:g}")
        counted.append((report.group, {**report.metrics, **own}))
    unvouched += len(by_row)  # on a row the learner took as a reset: no episode of its own ended there
    return Verdict(counted, disputes, unvouched)
