"""Learner-side state of every actor env, after SEED RL's UnrollStore.

Each connected env owns a slot. Per slot the store keeps the agent's recurrent state, the
previous action, whether the last step ended an episode, the env's run id, and the partial
unroll: a buffer of up to T+1 steps plus the agent state before its step 0.

All updates are vectorized over the slots of an inference batch: one indexed write per
field, no per-env Python loop. When a slot's buffer holds T+1 steps it is emitted as an
unroll, and its last step is kept as step 0 of the next one (the overlap).

A new run id for a slot (the actor restarted its env or itself) drops the partial unroll,
so no unroll ever mixes steps of two runs. Methods take `lock`: handshakes allocate slots
from gRPC threads while the inference thread writes.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

import numpy as np
import torch
from torch.utils import _pytree as pytree

from fleetrl.learner.tensor_tree import expand_mask

FieldSpecs = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]
Unroll = tuple[dict[str, torch.Tensor], Any]  # fields [k, T+1, ...], initial state [k, ...]


class EnvStateStore:
    def __init__(self, unroll_length: int, fields: FieldSpecs, action_fields: FieldSpecs,
                 state_template: Any, capacity: int = 64):
        """`fields`: every per-step field to record; `action_fields`: the actions, kept as the
        previous action too; `state_template`: one env's agent state, [1, ...] leaves."""
        self.steps_per_unroll = unroll_length + 1
        self._fields = dict(fields)
        self._action_fields = dict(action_fields)
        self._state_template = state_template
        self.lock = threading.Lock()
        self.dropped_partial_unrolls = 0
        self._capacity = 0
        self._free: list[int] = []
        self._buffers: dict[str, torch.Tensor] = {}
        self._prev_action: dict[str, torch.Tensor] = {}
        self._state = pytree.tree_map(lambda x: x[:0], state_template)
        self._unroll_state = self._state
        self._length = np.zeros(0, np.int64)
        self._run_id = np.zeros(0, np.uint64)
        self._ended = np.zeros(0, bool)
        self._teacher_forcing = np.zeros(0, bool)  # whether the env's current episode is teacher-forced
        self._grow(capacity)

    @property
    def num_allocated(self) -> int:
        return self._capacity - len(self._free)

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

    def begin_step(self, slots: np.ndarray, run_ids: np.ndarray) -> tuple[torch.Tensor, Any, dict[str, torch.Tensor]]:
        """Before inference: `first` flags, the agent state and the previous actions of `slots`."""
        with self.lock:
            new_run = self._run_id[slots] != run_ids
            if new_run.any():
                restarted = slots[new_run]
                self.dropped_partial_unrolls += int((self._length[restarted] > 1).sum())
                self._length[restarted] = 0
                self._run_id[restarted] = run_ids[new_run]
            first = torch.from_numpy(new_run | self._ended[slots])
            index = torch.from_numpy(slots)
            state = pytree.tree_map(lambda s: s[index], self._state)
            prev_action = {k: torch.where(expand_mask(first, v[index]), 0, v[index]) for k, v in self._prev_action.items()}
            return first, state, prev_action

    def teacher_forcing(self, slots: np.ndarray) -> np.ndarray:
        """Whether each env's current (or just ended) episode is teacher-forced."""
        with self.lock:
            return self._teacher_forcing[slots].copy()

    def end_step(self, slots: np.ndarray, step: Mapping[str, torch.Tensor] | None, state_before: Any,
                 state_after: Any, actions: Mapping[str, torch.Tensor], ended: np.ndarray,
                 teacher_forcing: np.ndarray | None = None) -> list[Unroll]:
        """After inference: records the step and returns the unrolls it completed. With
        `step` None (eval envs) only the agent state and previous action are kept."""
        with self.lock:
            if teacher_forcing is not None:
                self._teacher_forcing[slots] = teacher_forcing
            index = torch.from_numpy(slots)
            completed = [] if step is None else self._record(slots, index, step, state_before)
            self._write_state(self._state, index, state_after, None)
            for name, value in actions.items():
                self._prev_action[name][index] = value.to(self._prev_action[name].dtype)
            self._ended[slots] = ended
            return completed

    def _record(self, slots: np.ndarray, index: torch.Tensor, step: Mapping[str, torch.Tensor],
                state_before: Any) -> list[Unroll]:
        """Appends the step to each slot's partial unroll and emits the full ones, keeping
        their last step as step 0 of the next (the overlap)."""
        starting = torch.from_numpy(self._length[slots] == 0)
        if starting.any():
            self._write_state(self._unroll_state, index[starting], state_before, starting)
        position = torch.from_numpy(self._length[slots])
        for name, value in step.items():
            self._buffers[name][index, position] = value
        self._length[slots] += 1

        completed: list[Unroll] = []
        full = self._length[slots] == self.steps_per_unroll
        if full.any():
            full_t = torch.from_numpy(full)
            done = index[full_t]
            fields = {k: buf[done].clone() for k, buf in self._buffers.items()}
            initial = pytree.tree_map(lambda s: s[done].clone(), self._unroll_state)
            completed = [
                ({k: v[i] for k, v in fields.items()}, pytree.tree_map(lambda s: s[i:i + 1], initial))
                for i in range(len(done))
            ]
            for buf in self._buffers.values():
                buf[done, 0] = buf[done, -1]
            self._write_state(self._unroll_state, done, state_before, full_t)
            self._length[slots[full]] = 1
        return completed

    def _write_state(self, target: Any, index: torch.Tensor, source: Any, mask: torch.Tensor | None) -> None:
        for dst, src in zip(pytree.tree_leaves(target), pytree.tree_leaves(source)):
            dst[index] = (src if mask is None else src[mask]).to(dst.dtype)

    def _reset(self, slots: np.ndarray) -> None:
        self._length[slots] = 0
        self._run_id[slots] = 0  # actors never use run id 0, so the next step starts fresh
        self._ended[slots] = False
        self._teacher_forcing[slots] = False

    def _grow(self, capacity: int) -> None:
        extra = capacity - self._capacity

        def grown(old: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.cat([old, torch.zeros((extra, *shape), dtype=dtype)], dim=0)

        steps = self.steps_per_unroll
        self._buffers = {k: grown(self._buffers[k] if k in self._buffers else torch.zeros((0, steps, *shape), dtype=dtype),
                                  (steps, *shape), dtype)
                         for k, (dtype, shape) in self._fields.items()}
        self._prev_action = {k: grown(self._prev_action[k] if k in self._prev_action else torch.zeros((0, *shape), dtype=dtype),
                                      shape, dtype)
                             for k, (dtype, shape) in self._action_fields.items()}
        self._state = pytree.tree_map(lambda s, t: grown(s, tuple(t.shape[1:]), t.dtype), self._state, self._state_template)
        self._unroll_state = pytree.tree_map(lambda s, t: grown(s, tuple(t.shape[1:]), t.dtype),
                                             self._unroll_state, self._state_template)
        self._length = np.concatenate([self._length, np.zeros(extra, np.int64)])
        self._run_id = np.concatenate([self._run_id, np.zeros(extra, np.uint64)])
        self._ended = np.concatenate([self._ended, np.zeros(extra, bool)])
        self._teacher_forcing = np.concatenate([self._teacher_forcing, np.zeros(extra, bool)])
        self._free.extend(range(self._capacity, capacity))
        self._capacity = capacity

