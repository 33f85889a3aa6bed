"""What launchers show: the live progress line from the learner's status, and the final summary."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from fleetrl.proto import learner_pb2 as pb


class Progress:
    """One status line, redrawn in place on a terminal, printed every 10 s otherwise."""

    def __init__(self, interactive: bool):
        self.interactive = interactive
        self._last_print = 0.0
        self._drawn = False

    def show(self, status: pb.Status) -> None:
        ret = "-" if math.isnan(status.mean_episode_return) else f"{status.mean_episode_return:.1f}"
        lag = "-" if math.isnan(status.policy_lag) else f"{status.policy_lag:.1f}"
        line = (f"[{status.uptime_s:5.0f}s] env steps {status.env_steps:>10,} | {status.env_steps_per_s:7,.0f}/s | "
                f"return {ret:>6} ({status.episodes:,} eps) | lag {lag} | trainer {status.trainer_steps:,} | "
                f"actors {status.connected_actors}")
        if status.eval_rounds:
            line += f" | eval return {status.eval_mean_return:.1f} @ v{status.eval_policy_version:,}"
        if self.interactive:
            sys.stdout.write("\r\033[K" + line)
            sys.stdout.flush()
            self._drawn = True
        elif time.monotonic() - self._last_print >= 10:
            print(line, flush=True)
            self._last_print = time.monotonic()

    def end(self) -> None:
        if self._drawn:
            sys.stdout.write("\n")
            self._drawn = False


def print_summary(s: Mapping[str, Any]) -> None:
    """The learner's RunSummary (summary.json), in three lines."""
    print(f"done: {s['reason']}\n"
          f"  env steps {s['env_steps']:,} | episodes {s['episodes']:,} | mean return (recent) "
          f"{s['mean_episode_return']:.1f} | trainer steps {s['trainer_steps']:,} | {s['wall_s']:.0f}s")
    if s.get("target_reached") is False:
        print("  the target mean return was not reached")
