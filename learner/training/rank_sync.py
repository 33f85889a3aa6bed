"""What the learner ranks agree on once per batch: whether to stop, whether to checkpoint,
and the fleet's counters.

One learner (one rank) counts its own env steps and episodes. With data-parallel ranks,
the learning-rate schedule, the step budget, the return target, TensorBoard's step axis,
checkpoints and summary.json must all read the whole fleet's counts, and every rank must
read the same ones (so that they take the same optimizer steps and stop at the same
batch). `exchange` gathers each rank's row of counts in one collective, before each batch
is trained; between exchanges the fleet's counts are those of the last one.

With one rank there is nothing to exchange, and the counts are the live local ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from fleetrl.learner.accounting.metrics import EpisodeWindow
from fleetrl.learner.training.data_parallel import collective


class RanksDiverged(RuntimeError):
    """The ranks' weights differ: their optimizer steps were not the same."""


@dataclasses.dataclass
class FleetCounts:
    env_steps: int
    episodes: int
    mean_return: float  # the mean over ranks of their return windows' means; NaN until every window is full


@dataclasses.dataclass(frozen=True)
class Agreed:
    stop: bool  # some rank stops: every rank stops at this batch
    checkpoint: bool  # rank 0's checkpoint is due: every rank takes part after this batch


class RankSync:
    def __init__(self, world_size: int, local_env_steps: Callable[[], int], episodes: EpisodeWindow,
                 return_window: int, parameters: list[torch.nn.Parameter], timeout_s: float = 300.0):
        """`local_env_steps()` reads this rank's count (the inference step's); `parameters`,
        those whose checksum the ranks compare (the trainable ones: a frozen base never moves)."""
        self.world_size, self.timeout_s = world_size, timeout_s
        self._local_env_steps, self._episodes, self._window = local_env_steps, episodes, return_window
        self._parameters = parameters
        self._base = (0, 0)  # the counts every rank started from (a resumed checkpoint's)
        self._last = FleetCounts(0, 0, math.nan)

    def start_from(self, env_steps: int, episodes: int) -> None:
        """The counts a resume restored on every rank: the fleet's, counted once."""
        self._base = (env_steps, episodes)
        self._last = FleetCounts(env_steps, episodes, math.nan)

    def counts(self) -> FleetCounts:
        if self.world_size == 1:
            return FleetCounts(self._local_env_steps(), self._episodes.total, self._local_mean_return())
        return self._last

    def shown_return(self) -> float:
        """The mean return to report: the fleet's once every rank's window is full, else this
        learner's, however few episodes its window holds."""
        fleet = self.counts().mean_return
        return self._episodes.mean("return") if math.isnan(fleet) else fleet

    def shown_return_count(self) -> int:
        """How many episodes `shown_return` averages."""
        fleet = self.counts().mean_return
        return self._episodes.count("return") if math.isnan(fleet) else self._window * self.world_size

    def _local_mean_return(self) -> float:
        return self._episodes.mean("return") if len(self._episodes) >= self._window else math.nan

    def gather_ledgers(self, pairs: list[list[int]]) -> list[list[int]]:
        """Every rank's step ledger ([group, sequence] pairs) in one, a group's highest
        sequence kept: after a resume, an actor's resent step may reach any rank (a collective)."""
        if self.world_size == 1:
            return pairs
        signed = [[g - 2**64 if g >= 2**63 else g, s] for g, s in pairs]  # run ids are uint64
        mine = torch.tensor(signed, dtype=torch.int64).reshape(-1, 2)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        collective("step ledgers' sizes", self.timeout_s,
                   lambda: dist.all_gather(sizes, torch.tensor([len(mine)], dtype=torch.int64)))
        longest = max(int(n) for n in sizes)
        padded = torch.zeros(longest, 2, dtype=torch.int64)
        padded[:len(mine)] = mine
        rows = [torch.empty_like(padded) for _ in range(self.world_size)]
        collective("step ledgers' gather", self.timeout_s, lambda: dist.all_gather(rows, padded))
        merged: dict[int, int] = {}
        for row, n in zip(rows, sizes):
            for group, sequence in row[:int(n)].tolist():
                group %= 2**64
                merged[group] = max(sequence, merged.get(group, 0))
        return [[g, s] for g, s in merged.items()]

    def exchange(self, stopping: bool, checkpoint_due: bool = False) -> Agreed:
        """Whether any rank stops, and whether rank 0's checkpoint is due; updates the fleet's
        counts. Every rank calls it once per batch, before training it. Raises RanksDiverged
        if the ranks' weights differ."""
        if self.world_size == 1:
            return Agreed(stopping, checkpoint_due)
        base_steps, base_episodes = self._base
        mean_return = self._local_mean_return()
        with torch.no_grad():
            # Each parameter summed in place (float32 accumulation), no float64 copy of the weights.
            sums = [p.detach().sum(dtype=torch.float32) for p in self._parameters]
            checksum = float(torch.stack(sums).double().sum()) if sums else 0.0
        row = torch.tensor([float(stopping), self._local_env_steps() - base_steps,
                            self._episodes.total - base_episodes,
                            0.0 if math.isnan(mean_return) else 1.0, 0.0 if math.isnan(mean_return) else mean_return,
                            checksum, float(checkpoint_due)], dtype=torch.float64)
        rows = [torch.empty_like(row) for _ in range(self.world_size)]
        collective("per-batch exchange", self.timeout_s, lambda: dist.all_gather(rows, row))
        table = torch.stack(rows)
        if not torch.allclose(table[:, 5], table[0, 5], rtol=1e-9, atol=0):
            raise RanksDiverged(f"the learner ranks' weights differ (parameter sums {table[:, 5].tolist()}): their "
                                "optimizer steps were not the same")
        full = bool((table[:, 3] > 0).all())
        self._last = FleetCounts(env_steps=base_steps + int(table[:, 1].sum()),
                                 episodes=base_episodes + int(table[:, 2].sum()),
                                 mean_return=float(table[:, 4].mean()) if full else math.nan)
        return Agreed(stop=bool(table[:, 0].max() > 0), checkpoint=bool(table[0, 6] > 0))
