"""Files that a reader never sees half-written: write aside, flush, then rename over.

A crash (even SIGKILL) mid-write leaves the previous file whole, and two processes that
write the same path at once each leave a complete file. `durable` also fsyncs the file and
its folder, so the rename survives a power cut: worth it for checkpoints, not for caches.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from typing import IO, Any


def atomic_write(path: str, write: Callable[[IO[bytes]], None], durable: bool = False) -> None:
    """Calls `write` on a binary file that becomes `path` only once it is complete."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    if durable:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_text(path: str, text: str, durable: bool = False) -> None:
    atomic_write(path, lambda f: f.write(text.encode()), durable)


def atomic_write_json(path: str, data: Any, durable: bool = False, **dump_options: Any) -> None:
    atomic_write_text(path, strict_json(data, **dump_options), durable)


def strict_json(data: Any, **dump_options: Any) -> str:
    """`data` as JSON that strict parsers read: a NaN or infinite float is written as null
    (Python's json writes a bare NaN, which is not JSON)."""
    return json.dumps(finite_or_none(data), allow_nan=False, **dump_options)


def finite_or_none(data: Any) -> Any:
    """`data` with each NaN or infinite float, at any depth of dicts, lists and tuples, as None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite_or_none(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite_or_none(v) for v in data]
    return data
