"""Child processes that cannot outlive their launcher.

Each child runs in its own session (so a Ctrl-C reaches only the launcher, which then
stops the children in order) and, on Linux, asks the kernel to SIGKILL it if the launcher
dies: even a `kill -9` of the launcher leaves no orphan behind.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclasses.dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: str
    log_start: int = 0  # where this process's lines begin: the log may hold an earlier run's

    def tail(self, lines: int = 20) -> str:
        """The last lines this process wrote to its log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                return "".join(f.read().decode(errors="replace").splitlines(keepends=True)[-lines:])
        except OSError:
            return ""


class ChildProcesses:
    def __init__(self):
        self.children: list[Child] = []

    def start(self, name: str, argv: Sequence[str], log_path: str, env: dict[str, str] | None = None) -> Child:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        with open(log_path, "ab") as log:
            start = log.tell()
            process = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent, env={**os.environ, **(env or {})},
            )
        child = Child(name, process, log_path, start)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is not None]

    def stop(self, children: Sequence[Child] | None = None, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL whatever is still running after `timeout_s`."""
        children = list(self.children if children is None else children)
        for child in children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
