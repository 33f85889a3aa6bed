"""Which numbered steps the learner has already taken in: exactly-once episode stats.

An actor resends its unanswered steps after a broken stream (see actor.py), and the
learner may already have read one of them before the break. Each train step carries a
sequence number, 1, 2, 3, ... per group of envs an actor sends together, and a resent
step keeps its number. The ledger remembers the highest number taken in per group, keyed
by the step's first run id (random per env and actor process, so one group's key is no
other's), and says whether a step is new. The server counts a step's finished episodes
only when it is; the step is answered either way.

The ledger is the serving loop's: `take` runs there only, with no lock. A checkpoint
reads it from another thread through `state`, a copy made in one C call, which the GIL
does not interrupt.

Memory is bounded: the least recently stepped groups are forgotten past `max_groups`.
A live group steps every few milliseconds, so only the groups of actors that are gone
fall off.

The ledger goes into checkpoints (`state`, `restore`), so a learner that resumes after a
crash knows which of the steps its checkpoint already counted: an actor resends its
unanswered step to the new process, and that step may have been taken in before the
checkpoint was written.
"""

from __future__ import annotations

import collections


class StepLedger:
    def __init__(self, max_groups: int = 65_536):
        if max_groups < 1:
            raise ValueError(f"max_groups is {max_groups}; it must be at least 1")
        self.max_groups = max_groups
        self._last: collections.OrderedDict[int, int] = collections.OrderedDict()
        self.resent = 0  # steps that were not new

    def take(self, group: int, sequence: int) -> bool:
        """True the first time `sequence` (or a higher one) comes for `group`; False for a
        number already taken in, which is a resent step. Sequence 0 (unnumbered) is always new."""
        if sequence == 0:
            return True
        last = self._last.get(group, 0)
        if group in self._last:
            self._last.move_to_end(group)
        if sequence <= last:
            self.resent += 1
            return False
        self._last[group] = sequence
        if len(self._last) > self.max_groups:
            self._last.popitem(last=False)
        return True

    def state(self) -> list[list[int]]:
        """[group, highest sequence] pairs, least recently stepped first: plain ints, for a checkpoint."""
        return [[group, sequence] for group, sequence in list(self._last.items())]

    def restore(self, state: list[list[int]]) -> None:
        """Before serving (a resume)."""
        last = collections.OrderedDict((int(group), int(sequence)) for group, sequence in state)
        while len(last) > self.max_groups:
            last.popitem(last=False)
        self._last = last
