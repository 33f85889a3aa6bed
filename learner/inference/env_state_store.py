"""Learner-side state of every actor env, after SEED RL's UnrollStore.

Each connected env owns a slot. Per slot the store keeps the agent's recurrent state, the
previous action, whether the last step ended an episode, the env's run id, and the partial
unroll: a buffer of up to T+1 steps plus the agent state before its step 0.

All updates are vectorized over the slots of an inference batch: one indexed write per
field, no per-env Python loop. When a slot's buffer holds T+1 steps it is emitted as an
`Unroll`, and its last step is kept as step 0 of the next one (the overlap).

`lookup` only reads, and `end_step` does every write once inference has succeeded, so a
failed forward pass leaves the store as it was and the step can be retried. A new run id
for a slot (the actor restarted its env or itself) drops the partial unroll, so no unroll
ever mixes steps of two runs. Methods take `lock`: handshakes allocate slots from gRPC
threads while the inference thread writes.

The store records whatever per-step fields it is given, by name: it knows nothing of the
features (action chunks, teacher forcing, ...) that extras carry.

Its tensors live on the model's device, so a step's observations are written there once,
from the inference batch already on the device, and the unrolls it emits (and the batches
collated from them) never cross to the device again; the recurrent states stay there
between steps. Slot bookkeeping (lengths, run ids) stays on the host in numpy. On a GPU this
holds every env's partial unroll in GPU memory: envs x (unroll_length + 1) steps.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from fleetrl.learner.inference.tensor_tree import expand_mask
from fleetrl.losses.batch import ACTION, EXTRA, OBSERVATION, STEP_FIELDS, Unroll
from fleetrl.problems.base import Problem

FieldSpecs = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]


class EnvStateStore:
    def __init__(self, unroll_length: int, fields: FieldSpecs, action_fields: FieldSpecs,
                 state_template: Any, capacity: int = 64, device: torch.device | str = "cpu"):
        """`fields`: every per-step field to record (none: keep states only, as eval does);
        `action_fields`: the actions, kept as the previous action too; `state_template`: one
        env's agent state, [1, ...] leaves; `device`: where the tensors live (the model's)."""
        self.steps_per_unroll = unroll_length + 1
        self.device = torch.device(device)
        self._fields = dict(fields)
        self._action_fields = dict(action_fields)
        self._state_template = state_template
        self.lock = threading.Lock()
        self.dropped_partial_unrolls = 0
        self.restarted_envs = 0  # slots whose run id changed mid-stream: an actor restarted that env
        self._capacity = 0
        self._free: list[int] = []
        self._buffers: dict[str, torch.Tensor] = {}
        self._prev_action: dict[str, torch.Tensor] = {}
        self._state = pytree.tree_map(lambda x: x[:0].to(self.device), state_template)
        self._unroll_state = self._state
        self._length = np.zeros(0, np.int64)  # steps in the partial unroll
        self._unrolls = np.zeros(0, np.int64)  # unrolls emitted in the slot's current run
        self._run_id = np.zeros(0, np.uint64)
        self._ended = np.zeros(0, bool)
        self._grow(capacity)

    def num_allocated(self) -> int:
        return self._capacity - len(self._free)

    def free_slots(self) -> int:
        return len(self._free)

    def reserve(self, count: int) -> None:
        """Grows the store, if need be, so that `count` slots are free. Growing copies every
        per-slot buffer (GPU memory, for image observations): the server calls this off its
        event loop before `allocate`, so that a large actor joining stalls no other stream."""
        with self.lock:
            if len(self._free) < count:
                self._grow(max(2 * self._capacity, self._capacity + count))

    def allocate(self, count: int) -> np.ndarray:
        with self.lock:
            if len(self._free) < count:
                self._grow(max(2 * self._capacity, self._capacity + count))
            slots = np.array(sorted(self._free)[:count], np.int64)
            taken = set(slots.tolist())
            self._free = [s for s in self._free if s not in taken]
            self._reset(slots)
            return slots

    def release(self, slots: np.ndarray) -> None:
        with self.lock:
            self.dropped_partial_unrolls += int((self._length[slots] > 1).sum())
            self._reset(slots)
            self._free.extend(slots.tolist())

    def lookup(self, slots: np.ndarray, run_ids: np.ndarray) -> tuple[np.ndarray, Any, dict[str, torch.Tensor]]:
        """Before inference, without changing anything: the `first` flags (a new run, or the
        last step ended an episode; on the host), the agent state and the previous actions
        of `slots` (on the device)."""
        with self.lock:
            first = (self._run_id[slots] != run_ids) | self._ended[slots]
            index, first_mask = self._on_device(slots), self._on_device(first)
            state = pytree.tree_map(lambda s: s[index], self._state)
            prev_action = {k: torch.where(expand_mask(first_mask, v[index]), 0, v[index])
                           for k, v in self._prev_action.items()}
            return first, state, prev_action

    def end_step(self, slots: np.ndarray, run_ids: np.ndarray, step: Mapping[str, torch.Tensor] | None,
                 state_before: Any, state_after: Any, actions: Mapping[str, torch.Tensor],
                 ended: np.ndarray) -> list[Unroll]:
        """After inference: records the step and returns the unrolls it completed. With
        `step` None (eval envs) only the agent state and previous action are kept."""
        with self.lock:
            new_run = self._run_id[slots] != run_ids
            if new_run.any():
                restarted = slots[new_run]
                self.restarted_envs += int((self._run_id[restarted] != 0).sum())  # 0: the slot's first step
                self.dropped_partial_unrolls += int((self._length[restarted] > 1).sum())
                self._length[restarted] = 0
                self._unrolls[restarted] = 0
                self._run_id[restarted] = run_ids[new_run]
            index = self._on_device(slots)
            completed = [] if step is None else self._record(slots, index, step, state_before)
            self._write_state(self._state, index, state_after, None)
            for name, previous in self._prev_action.items():  # the actors' actions, not learner-side fields
                previous[index] = actions[name].to(previous.dtype)
            self._ended[slots] = ended
            return completed

    def _record(self, slots: np.ndarray, index: torch.Tensor, step: Mapping[str, torch.Tensor],
                state_before: Any) -> list[Unroll]:
        """Appends the step to each slot's partial unroll and emits the full ones, keeping
        their last step as step 0 of the next (the overlap)."""
        starting = self._length[slots] == 0
        if starting.any():
            starting_mask = self._on_device(starting)
            self._write_state(self._unroll_state, index[starting_mask], state_before, starting_mask)
        position = self._on_device(self._length[slots])
        for name, value in step.items():
            self._buffers[name][index, position] = value
        self._length[slots] += 1

        full = self._length[slots] == self.steps_per_unroll
        if not full.any():
            return []
        full_t = self._on_device(full)
        done = index[full_t]
        done_slots = slots[full]
        fields = {k: buf[done] for k, buf in self._buffers.items()}  # indexing copies: the unrolls own these
        initial = pytree.tree_map(lambda s: s[done], self._unroll_state)
        completed = [
            Unroll(slot=int(slot), run_id=int(self._run_id[slot]), index=int(self._unrolls[slot]),
                   steps={k: v[i] for k, v in fields.items()},
                   initial_state=pytree.tree_map(lambda s: s[i:i + 1], initial))
            for i, slot in enumerate(done_slots.tolist())
        ]
        for buf in self._buffers.values():
            buf[done, 0] = buf[done, -1]
        self._write_state(self._unroll_state, done, state_before, full_t)
        self._length[done_slots] = 1
        self._unrolls[done_slots] += 1
        return completed

    def _on_device(self, array: np.ndarray) -> torch.Tensor:
        # Small index arrays: a non-blocking copy from pageable memory waits for no kernel.
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def _write_state(self, target: Any, index: torch.Tensor, source: Any, mask: torch.Tensor | None) -> None:
        for dst, src in zip(pytree.tree_leaves(target), pytree.tree_leaves(source)):
            dst[index] = (src if mask is None else src[mask]).to(dst.dtype)

    def _reset(self, slots: np.ndarray) -> None:
        self._length[slots] = 0
        self._unrolls[slots] = 0
        self._run_id[slots] = 0  # actors never use run id 0, so the next step starts fresh
        self._ended[slots] = False

    def _grow(self, capacity: int) -> None:
        extra = capacity - self._capacity

        def grown(old: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            old = torch.zeros((0, *shape), dtype=dtype, device=self.device) if old is None else old
            return torch.cat([old, torch.zeros((extra, *shape), dtype=dtype, device=self.device)], dim=0)

        steps = self.steps_per_unroll
        self._buffers = {k: grown(self._buffers.get(k), (steps, *shape), dtype)
                         for k, (dtype, shape) in self._fields.items()}
        self._prev_action = {k: grown(self._prev_action.get(k), shape, dtype)
                             for k, (dtype, shape) in self._action_fields.items()}
        self._state = pytree.tree_map(lambda s, t: grown(s, tuple(t.shape[1:]), t.dtype),
                                      self._state, self._state_template)
        self._unroll_state = pytree.tree_map(lambda s, t: grown(s, tuple(t.shape[1:]), t.dtype),
                                             self._unroll_state, self._state_template)
        self._length = np.concatenate([self._length, np.zeros(extra, np.int64)])
        self._unrolls = np.concatenate([self._unrolls, np.zeros(extra, np.int64)])
        self._run_id = np.concatenate([self._run_id, np.zeros(extra, np.uint64)])
        self._ended = np.concatenate([self._ended, np.zeros(extra, bool)])
        self._free.extend(range(self._capacity, capacity))
        self._capacity = capacity


def build_state_store(problem: Problem, agent: torch.nn.Module, unroll_length: int, device: torch.device,
                      record: bool = True) -> EnvStateStore:
    """The state store for `problem`'s observations, actions and extras and `agent`'s
    recurrent state; with `record` False (eval envs) it keeps states only, no unrolls.

    One dry step of the agent on a zero observation finds the per-env shape of the
    log-probs (unreduced with action chunks) and fails early, by name, when the agent
    does not fit the env."""
    def fields(specs) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {s.name: (torch.from_numpy(np.zeros(0, s.dtype)).dtype, s.shape) for s in specs}

    policy = problem.action_policy()
    obs_fields, action_fields = fields(problem.observation_specs()), fields(problem.action_specs())
    extra_fields = fields(problem.extra_specs())
    obs_fields.update({f"prev_action/{k}": v for k, v in action_fields.items()})

    def zeros(specs: dict) -> dict[str, torch.Tensor]:
        return {k: torch.zeros((1, *shape), dtype=dtype, device=device) for k, (dtype, shape) in specs.items()}

    example = zeros(obs_fields)
    try:
        with torch.no_grad():
            state = agent.initial_state(example)
            out, _ = agent.step(example, torch.ones(1, dtype=torch.bool, device=device), state)
            log_prob = policy.action_log_prob(out, policy.select_actor_action(out, example, zeros(extra_fields)))
    except (RuntimeError, ValueError, KeyError, IndexError) as e:
        raise ValueError(f"problem {type(problem).__name__}: the agent failed on an observation of the env's "
                         f"spaces ({', '.join(s.describe() for s in problem.observation_specs())}); do the "
                         f"agent's sizes match the env's observations and actions? {type(e).__name__}: {e}") from e
    state_template = pytree.tree_map(lambda x: x.detach(), state)
    if not record:
        return EnvStateStore(unroll_length, {}, action_fields, state_template, device=device)
    step_fields = {OBSERVATION + k: v for k, v in obs_fields.items()}
    step_fields.update({ACTION + k: v for k, v in {**action_fields, **fields(policy.learner_action_specs())}.items()})
    step_fields.update({EXTRA + k: v for k, v in extra_fields.items()})
    step_fields.update({k: (dtype, ()) for k, dtype in STEP_FIELDS.items()})
    step_fields["behaviour_log_prob"] = (torch.float32, tuple(log_prob.shape[1:]))
    return EnvStateStore(unroll_length, step_fields, action_fields, state_template, device=device)
