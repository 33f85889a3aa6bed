"""FSDP learner ranks (`--fsdp`): the trained weights, gradients and optimizer state sharded.

With `--fsdp`, each rank trains a copy of the agent sharded by FSDP2 (`fully_shard`): it
keeps 1/N of the weights, of their gradients (reduce-scattered, and so averaged, in the
backward pass) and of the optimizer state. Inference keeps its own whole copy, the agent
the learner built, refreshed after every optimizer step:

- Why a copy, not all-gathers for inference: each rank's inference batches run when its
  own actors' steps arrive, so the ranks' forward passes do not line up, and an all-gather
  needs every rank at once. Training's passes do line up (lockstep batches), so only they
  run on the shards.
- The cost: the whole weights once more per rank (inference's), and after each optimizer
  step an all-gather of the trainable weights (LoRA adapters and heads only, when the base
  is frozen; `bench/learner_ranks.py --fsdp` measures it).

The whole agent is one FSDP unit: its parameters are gathered once per `unroll` (the
training entry point, registered with FSDP), for every rank alike. Smaller units (each
transformer layer) would lower the peak, but a module run only on some ranks (an
instruction encoder, run where an episode starts) would leave a rank waiting in its
all-gather; docs/deployment.md says so. FSDP2 wants one dtype for the trained weights of a
unit (a frozen bfloat16 base under float32 adapters and heads is fine); an agent that trains
weights of two dtypes is refused by name.

Checkpoints keep the one format: the weights are the inference copy's, and the optimizer
state is gathered whole (a collective: every rank takes part, rank 0 writes it) and keyed
as `torch.optim.Optimizer.state_dict` keys it, so a run resumes with or without FSDP and
with any number of ranks.
"""

from __future__ import annotations

import copy
import logging
import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor

from fleetrl.agents.base import Agent
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.data_parallel import DataParallel, collective

log = logging.getLogger(__name__)


class ShardedAgent:
    def __init__(self, agent: Agent, ranks: DataParallel):
        """`agent` is inference's whole copy; `training` becomes its sharded twin."""
        dtypes = {p.dtype for p in agent.parameters() if p.requires_grad}
        if len(dtypes) > 1:  # a frozen base may have another (bfloat16 under float32 adapters)
            raise ValueError(f"--fsdp shards {type(agent).__name__} as one unit, and FSDP needs one dtype for the "
                             f"trained weights of a unit; they have {sorted(str(d) for d in dtypes)}")
        self.inference, self.ranks = agent, ranks
        self._dtype = dtypes.pop() if dtypes else torch.float32
        self.training = copy.deepcopy(agent)
        mesh = init_device_mesh(ranks.device.type, (ranks.world_size,))
        # Kept whole from forward to backward: one unit would be gathered whole again for its
        # backward anyway, and an output changed in place could lose FSDP's re-gather hook.
        fully_shard(self.training, mesh=mesh, reshard_after_forward=False)
        # Its warning that an output view changed in place would skip that re-gather: not taken here.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        register_fsdp_forward_method(self.training, "unroll")
        names = dict(agent.named_parameters())
        # Only what an update changes is gathered after it: the trainable weights, and the
        # buffers (input statistics) the trainer updates.
        self._published = [(p, names[n]) for n, p in self.training.named_parameters() if p.requires_grad]
        self._buffers = list(zip(self.training.buffers(), agent.buffers()))
        # Each rank's row of dim 0 of each published weight, as FSDP2 cuts it (torch.chunk;
        # a rank past the last chunk holds none): what one flat all-gather must put back.
        self._rows = []
        for shard, _ in self._published:
            rows = [len(c) for c in torch.chunk(torch.empty(shard.shape[0], device="meta"), ranks.world_size)]
            rows += [0] * (ranks.world_size - len(rows))
            if shard.to_local().shape[0] != rows[ranks.rank]:
                raise RuntimeError(f"FSDP cut a weight of shape {tuple(shard.shape)} other than torch.chunk does: "
                                   f"rank {ranks.rank} holds {shard.to_local().shape[0]} rows, not {rows[ranks.rank]}")
            self._rows.append(rows)
        row_size = [shard[0].numel() if shard.dim() else 1 for shard, _ in self._published]
        self._numel = [[r * n for r in rows] for rows, n in zip(self._rows, row_size)]  # [weight][rank]
        self._longest = max((sum(n[r] for n in self._numel) for r in range(ranks.world_size)), default=0)

    @classmethod
    def of(cls, config, agent: Agent, ranks: DataParallel | None) -> ShardedAgent | None:
        """The sharded twin a LearnerConfig asks for (--fsdp); None without it."""
        if not config.fsdp:
            return None
        if ranks is None:
            raise ValueError("--fsdp shards the training over learner ranks: give it --learner_ranks (or "
                             "torchrun's --nproc_per_node) of 2 or more")
        log.info("training sharded by FSDP over %d learner ranks; inference keeps a whole copy", ranks.world_size)
        return cls(agent, ranks)

    def load_inference_weights(self) -> None:
        """The inference copy's weights (a resume's, rank 0's broadcast) into the shards. Every
        rank holds them whole, so each cuts its own shard, with no communication."""
        with torch.no_grad():
            for shard, source in zip(self.training.parameters(), self.inference.parameters()):
                mine = distribute_tensor(source.detach(), shard.device_mesh, shard.placements, src_data_rank=None)
                shard.to_local().copy_(mine.to_local())
            for target, source in zip(self.training.buffers(), self.inference.buffers()):
                target.copy_(source)

    def publish(self, policy: PolicyVersion) -> None:
        """The trained weights, gathered (one flat all-gather of every rank's shards), into the
        inference copy as the policy's next version, under its lock."""
        world = self.ranks.world_size
        with torch.no_grad():
            mine = torch.zeros(self._longest, dtype=self._dtype, device=self.ranks.device)
            flat = torch.cat([p.to_local().reshape(-1) for p, _ in self._published]) if self._published else mine[:0]
            mine[:len(flat)] = flat
            rows = [torch.empty_like(mine) for _ in range(world)]
            collective("weights' all-gather", self.ranks.timeout_s, lambda: dist.all_gather(rows, mine))
            offsets = [0] * world
            whole = []
            for numel, (_, target) in zip(self._numel, self._published):
                pieces = [rows[r][offsets[r]:offsets[r] + numel[r]] for r in range(world)]
                offsets = [o + n for o, n in zip(offsets, numel)]
                whole.append(torch.cat(pieces).view_as(target))
            with policy.lock:
                policy.version += 1
                for value, (_, target) in zip(whole, self._published):
                    target.copy_(value)
                for source, target in self._buffers:
                    target.copy_(source)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The whole optimizer state, keyed as an unsharded optimizer's state_dict (a
        collective; ranks other than 0 get an empty dict)."""
        by_name = collective("optimizer state's gather", self.ranks.timeout_s, lambda: get_optimizer_state_dict(
            self.training, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        if not by_name:
            return {}
        ids = {name: i for i, name in enumerate(n for group in by_name["param_groups"] for n in group["params"])}
        return {"state": {ids[name]: value for name, value in by_name["state"].items()},
                "param_groups": [{**group, "params": [ids[n] for n in group["params"]]}
                                 for group in by_name["param_groups"]]}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """An unsharded optimizer's state_dict (every rank holds it whole) into the shards."""
        name_of = {id(p): n for n, p in self.training.named_parameters()}
        names = [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
        saved = [i for group in state["param_groups"] for i in group["params"]]
        if len(saved) != len(names):
            raise ValueError(f"the checkpoint's optimizer state has {len(saved)} parameters; this agent trains "
                             f"{len(names)}")
        by_name = {"state": {names[i]: value for i, value in state["state"].items()},
                   "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                                    for group in state["param_groups"]]}
        for group, saved_group in zip(optimizer.param_groups, state["param_groups"]):
            for key, value in saved_group.items():  # what a schedule added (initial_lr): torch maps only known keys
                if key != "params":
                    group.setdefault(key, value)
        set_optimizer_state_dict(self.training, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def whole(value: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered (clip_grad_norm_'s total norm over DTensor gradients)."""
    return value.full_tensor() if isinstance(value, DTensor) else value
