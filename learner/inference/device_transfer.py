"""An inference batch's way to the model's device, and its results' way back.

A batch arrives as row blocks, one per actor request, read-only views of the decoded
messages. The staged path (the GPU default) writes each block once, straight into one
pinned host buffer kept and grown across batches, and sends that buffer to the device in
one non-blocking copy: two copies of an observation between the message and the device,
and one host-to-device round trip for the dozen tensors of a step (observations, extras,
rewards, flags). The results the host needs (the actions sent back) are packed on the
device and come back in one copy.

The plain path concatenates each field's blocks (the one copy that must be made: the
blocks are separate and read-only) and moves each tensor with `.to(device)`, which on CPU
copies nothing, so it is the CPU default. The staged path runs on CPU too (without
pinning), which is how the tests check that it gives exactly what the plain path gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
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
        self._sent: torch.cuda.Event | None = None  # the last host-to-device copy out of the buffer

    def rows_to_device(self, blocks: Mapping[str, Sequence[np.ndarray]]) -> dict[str, torch.Tensor]:
        """Each field's row blocks ([n_i, ...] arrays of one dtype), concatenated, on the device."""
        if not self.staged:
            return {k: torch.from_numpy(np.concatenate(parts)).to(self.device) for k, parts in blocks.items()}
        like = [(_torch_dtype(parts[0].dtype), (sum(len(p) for p in parts), *parts[0].shape[1:]))
                for parts in blocks.values()]
        layout, host = self._staging(like)
        for parts, (start, stop), (dtype, shape) in zip(blocks.values(), layout, like):
            np.concatenate(parts, out=host[start:stop].view(dtype).reshape(shape).numpy())
        return dict(zip(blocks, self._send(host, like, layout)))

    def to_device(self, tree: Any) -> Any:
        """`tree`'s tensors (on the host) on the device."""
        if not self.staged:
            return pytree.tree_map(lambda x: x.to(self.device), tree)
        leaves, spec = pytree.tree_flatten(tree)
        like = [(leaf.dtype, tuple(leaf.shape)) for leaf in leaves]
        layout, host = self._staging(like)
        for leaf, (start, stop) in zip(leaves, layout):
            host[start:stop].copy_(_bytes(leaf))
        return pytree.tree_unflatten(self._send(host, like, layout), spec)

    def to_host(self, tree: Any) -> Any:
        """`tree`'s tensors (on the device) on the host; staged, they are views of one host tensor."""
        if not self.staged:
            return pytree.tree_map(lambda x: x.cpu(), tree)
        leaves, spec = pytree.tree_flatten(tree)
        like = [(leaf.dtype, tuple(leaf.shape)) for leaf in leaves]
        layout, size = _layout(like)
        packed = torch.zeros(size, dtype=torch.uint8, device=self.device)
        for leaf, (start, stop) in zip(leaves, layout):
            packed[start:stop] = _bytes(leaf)
        return pytree.tree_unflatten(_unpack(packed.cpu(), like, layout), spec)

    def _staging(self, like: list[tuple[torch.dtype, tuple[int, ...]]]) -> tuple[list[tuple[int, int]], torch.Tensor]:
        """The packed layout of tensors like `like`, and the host buffer to write it into,
        once the last copy out of it has finished."""
        layout, size = _layout(like)
        if self._sent is not None:  # usually long done: the last batch's results came back since
            self._sent.synchronize()
        if self._host_buffer.numel() < size:
            self._host_buffer = torch.empty(max(size, 2 * self._host_buffer.numel()), dtype=torch.uint8,
                                            pin_memory=self._pin)
        return layout, self._host_buffer[:size]

    def _send(self, host: torch.Tensor, like, layout) -> list[torch.Tensor]:
        device = host.to(self.device, non_blocking=True)
        if self._pin:
            self._sent = torch.cuda.Event()
            self._sent.record()
        return _unpack(device, like, layout)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _layout(like: list[tuple[torch.dtype, tuple[int, ...]]]) -> tuple[list[tuple[int, int]], int]:
    """Each tensor's [start, stop) bytes in a packed buffer, and the buffer's size."""
    layout, offset = [], 0
    for dtype, shape in like:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        layout.append((offset, offset + nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return layout, offset


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _unpack(packed: torch.Tensor, like, layout: list[tuple[int, int]]) -> list[torch.Tensor]:
    return [packed[start:stop].view(dtype).reshape(shape) for (dtype, shape), (start, stop) in zip(like, layout)]
