"""An inference batch's way to the model's device, and its results' way back.

On a GPU, each host-to-device copy of ordinary (pageable) memory is synchronous, and
each device-to-host copy waits for the stream. A batch is a dozen small tensors (the
observations, the `first` flags, the recurrent state, the extras) and its results as
many (actions, log-probs, values, the new state), so copying them one by one costs a
dozen round trips per step. The staged path instead:

- packs the batch's tensors into one pinned host buffer, kept and grown across batches,
  and sends it with one non-blocking copy;
- packs every result the host needs into one device buffer and brings it back in one copy.

The plain path moves each tensor with `.to(device)`: on CPU that is no copy at all, so it
is the CPU default. The staged path runs on CPU too (without pinning), which is how the
tests check that it gives exactly what the plain path gives.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

TRANSFERS = ("auto", "plain", "staged")

# Each tensor starts at a multiple of this many bytes in a packed buffer, so that its
# bytes can be viewed as any dtype.
_ALIGN = 16


class DeviceTransfer:
    def __init__(self, device: torch.device, mode: str = "auto"):
        if mode not in TRANSFERS:
            raise ValueError(f"unknown inference transfer {mode!r}; choose from {list(TRANSFERS)}")
        self.device = device
        self.staged = device.type == "cuda" if mode == "auto" else mode == "staged"
        self._pin = device.type == "cuda"
        self._host_buffer = torch.empty(0, dtype=torch.uint8)

    def to_device(self, tree: Any) -> Any:
        """`tree`'s tensors (on the host) on the device."""
        if not self.staged:
            return pytree.tree_map(lambda x: x.to(self.device), tree)
        leaves, spec = pytree.tree_flatten(tree)
        layout, size = _layout(leaves)
        if self._host_buffer.numel() < size:
            # The last batch's copy has completed: its results came back (to_host) before this batch.
            self._host_buffer = torch.empty(max(size, 2 * self._host_buffer.numel()), dtype=torch.uint8,
                                            pin_memory=self._pin)
        host = self._host_buffer[:size]
        for leaf, (start, stop) in zip(leaves, layout):
            host[start:stop].copy_(_bytes(leaf))
        device = host.to(self.device, non_blocking=True)
        return pytree.tree_unflatten(_unpack(device, leaves, layout), spec)

    def to_host(self, tree: Any) -> Any:
        """`tree`'s tensors (on the device) on the host; staged, they are views of one host tensor."""
        if not self.staged:
            return pytree.tree_map(lambda x: x.cpu(), tree)
        leaves, spec = pytree.tree_flatten(tree)
        layout, size = _layout(leaves)
        packed = torch.zeros(size, dtype=torch.uint8, device=self.device)
        for leaf, (start, stop) in zip(leaves, layout):
            packed[start:stop] = _bytes(leaf)
        return pytree.tree_unflatten(_unpack(packed.cpu(), leaves, layout), spec)


def _layout(leaves: list[torch.Tensor]) -> tuple[list[tuple[int, int]], int]:
    """Each leaf's [start, stop) bytes in a packed buffer, and the buffer's size."""
    layout, offset = [], 0
    for leaf in leaves:
        nbytes = leaf.numel() * leaf.element_size()
        layout.append((offset, offset + nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return layout, offset


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _unpack(packed: torch.Tensor, like: list[torch.Tensor], layout: list[tuple[int, int]]) -> list[torch.Tensor]:
    return [packed[start:stop].view(leaf.dtype).reshape(leaf.shape) for leaf, (start, stop) in zip(like, layout)]
