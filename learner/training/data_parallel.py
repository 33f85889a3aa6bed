"""Data-parallel learner ranks over torch.distributed: the same weights on every rank.

Each rank is a whole learner (its own actors, inference and unrolls). What they share goes
through one process group (gloo on CPU, NCCL on GPU):

- at the start, rank 0's weights are broadcast, so every rank starts from the same ones
  (a resume loads rank 0's checkpoint on every rank: the same weights and optimizer state,
  whatever the world size that wrote it);
- after each backward pass, the gradients are averaged over the ranks in one flat bucket
  (the all-reduce that DDP does; done here because an agent's training entry point is
  `unroll`, not `forward`), so every rank takes the same optimizer step;
- once per batch, the ranks agree on whether to stop and on the fleet's counts
  (`fleetrl.learner.training.rank_sync`), so the learning-rate schedule and the step budget see
  the whole fleet.

Ranks train in lockstep: a rank whose actors are slow holds every other rank at its next
collective. A rank that dies or hangs makes the others' next collective fail after
`timeout_s` (a RuntimeError naming the collective), not hang.

torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) configures it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int

    @classmethod
    def from_environment(cls) -> RankEnv:
        """torchrun's RANK and WORLD_SIZE; one rank of one when they are unset."""
        try:
            return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
        except ValueError as e:
            raise ValueError(f"RANK and WORLD_SIZE must be integers: {e}") from e


class RankFailure(RuntimeError):
    """A collective of the learner ranks failed: a rank died, or hung past the timeout."""


def collective(name: str, timeout_s: float, operation: Callable[[], Any]) -> Any:
    """`operation()`, a collective; its failure raised as RankFailure, naming it."""
    try:
        return operation()
    except RuntimeError as e:
        raise RankFailure(f"the learner ranks' {name} failed: another rank died or did not join within "
                          f"collective_timeout_s={timeout_s:g}s ({type(e).__name__}: {e})") from e


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


class DataParallel:
    def __init__(self, rank: int, world_size: int, device: torch.device, timeout_s: float = 300.0,
                 init_method: str = "env://"):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.rank, self.world_size, self.device, self.timeout_s = rank, world_size, device, timeout_s
        if not dist.is_initialized():
            dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout_s))

    @classmethod
    def of(cls, config, device: torch.device) -> DataParallel | None:
        """The group of a LearnerConfig's ranks; None for a learner on its own."""
        return cls(config.rank, config.world_size, device, config.collective_timeout_s) if config.world_size > 1 \
            else None

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers, on every rank."""
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                collective("weights' broadcast", self.timeout_s, lambda t=tensor: dist.broadcast(t.data, src=0))

    def average_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Every trainable parameter's gradient, averaged over the ranks (a missing one counts
        as zero, so every rank reduces the same bucket)."""
        trainable = [p for p in parameters if p.requires_grad]
        if not trainable:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable]
        bucket = torch.cat([g.reshape(-1) for g in grads])
        collective("gradient all-reduce", self.timeout_s, lambda: dist.all_reduce(bucket))
        bucket /= self.world_size
        offset = 0
        for parameter, grad in zip(trainable, grads):
            n = grad.numel()
            parameter.grad = bucket[offset:offset + n].view_as(parameter).clone()
            offset += n

    def mean(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64)
        collective("mean", self.timeout_s, lambda: dist.all_reduce(tensor))
        return float(tensor) / self.world_size

    def close(self, abandoned: bool = False) -> None:
        """Ends the group; `abandoned` (after a failure) leaves a broken group to the process's
        exit, since tearing it down can wait on the rank that failed."""
        if dist.is_initialized() and not abandoned:
            dist.destroy_process_group()
