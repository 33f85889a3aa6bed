"""What launchers show: the live progress line, the final summary, the next commands to run, and
an evaluation's episodes as they finish."""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fleetrl.problems.registry import registered_names
from fleetrl.proto import learner_pb2 as pb


class EpisodeProgress:
    """Prints the episodes done and their running means, at most once every `interval_s`
    (and for the last one): a long evaluation shows it is alive."""

    def __init__(self, total: int, interval_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.total, self.interval_s, self._clock = total, interval_s, clock
        self._last = -math.inf

    def __call__(self, results: dict[int, dict[str, float]]) -> None:
        now = self._clock()
        if now - self._last < self.interval_s and len(results) < self.total:
            return
        self._last = now
        names = sorted({n for metrics in results.values() for n in metrics}, key=lambda n: (n != "return", n))
        means = [f"{n} {np.mean([m[n] for m in results.values() if n in m]):.3g}" for n in names[:4]]
        print(f"episodes {len(results):,}/{self.total:,} | " + " | ".join(means), flush=True)


class Progress:
    """One status line, redrawn in place on a terminal, printed every 10 s otherwise (and
    once more at the end, so that a log always holds the run's last state)."""

    def __init__(self, interactive: bool):
        self.interactive = interactive
        self._last_print = 0.0
        self._drawn = False
        self._unprinted: str | None = None

    def show(self, status: pb.Status) -> None:
        line = (f"[{status.uptime_s:5.0f}s] env steps {status.env_steps:>10,} | {status.env_steps_per_s:7,.0f}/s | "
                f"return (last {status.return_window}) {_number(status.mean_episode_return):>6} "
                f"({status.episodes:,} eps) | lag {_number(status.policy_lag)} updates | "
                f"trainer {status.trainer_steps:,} | actors {status.connected_actors}")
        if not status.episodes and status.losses:  # a warm start: no episodes of its own, a loss to watch
            name = "teacher_forcing" if "teacher_forcing" in status.losses else "total"
            line += f" | loss {name} {status.losses[name]:.4g}"
        if status.eval_rounds:
            metric = status.eval_metric or "return"
            line += " | eval " if metric == "return" else f" | eval {metric} {_number(status.eval_metric_value, 2)}, "
            line += f"return {_number(status.eval_mean_return)} @ v{status.eval_policy_version:,}"
        if self.interactive:
            sys.stdout.write("\r\033[K" + line)
            sys.stdout.flush()
            self._drawn = True
        elif time.monotonic() - self._last_print >= 10:
            print(line, flush=True)
            self._last_print = time.monotonic()
            self._unprinted = None
        else:
            self._unprinted = line

    def end(self) -> None:
        if self._drawn:
            sys.stdout.write("\n")
            self._drawn = False
        if self._unprinted is not None:
            print(self._unprinted, flush=True)
            self._unprinted = None


def _number(value: float | None, digits: int = 1) -> str:
    """A figure, or "-" for none: NaN in a status, null in summary.json (strict JSON)."""
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def print_summary(s: Mapping[str, Any]) -> None:
    """The learner's RunSummary (summary.json), in three lines."""
    print(f"done: {s['reason']}\n"
          f"  env steps {s['env_steps']:,} | episodes {s['episodes']:,} | mean return of the last "
          f"{s['return_window']} {_number(s['mean_episode_return'])} | trainer steps {s['trainer_steps']:,} | "
          f"{_durations(s)}")
    if s.get("target_reached") is False:
        print("  the target mean return was not reached")


def _durations(s: Mapping[str, Any]) -> str:
    """This process's wall time, and the run's when a resume makes it longer."""
    run = s.get("run_wall_s")
    if run is None or run - s["wall_s"] < 1:
        return f"{s['wall_s']:.0f}s"
    return f"{s['wall_s']:.0f}s (the run's {run:.0f}s, resumes included)"


def script(name: str) -> str:
    """How to run this Python environment's script `name` as printed: .venv/bin/name when the
    environment sits below the current folder, its full path elsewhere, else the bare name."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        return name
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


# What the printed eval command plays of a heavy Problem (simulators in processes of their
# own, LIBERO's): a few episodes on one env, which any machine that trained it can play.
HEAVY_EVAL_EPISODES, HEAVY_EVAL_ENVS = 3, 1


def watch_command(logdir: str, problem_name: str, problem: Any = None) -> tuple[str, str]:
    """The command that plays the trained policy, as printed; and a note on what it leaves
    out ("" when nothing). A Problem of the user's own is named (a checkpoint's import path
    is not imported unless it is), with the PYTHONPATH it was found on; a heavy Problem plays
    a few episodes on one env; --record is offered where there is something to draw."""
    own = bool(problem_name) and problem_name not in registered_names()
    pythonpath = os.environ.get("PYTHONPATH", "")
    command = f"PYTHONPATH={shlex.quote(pythonpath)} " if own and pythonpath else ""
    command += f"{script('python')} -m fleetrl.launch.evaluate --checkpoint={shlex.quote(logdir)}"
    command += f" --problem={problem_name}" if own else ""
    note = ""
    heavy = problem is not None and problem.envs_in_subprocesses
    if heavy:
        command += f" --episodes={HEAVY_EVAL_EPISODES} --num_envs={HEAVY_EVAL_ENVS}"
        note = (f"{HEAVY_EVAL_EPISODES} of the {problem.num_eval_episodes()} episodes of the eval set; "
                "--episodes=0 plays them all, and --num_envs as many at once as memory allows")
    if problem is None or _recordable(problem, build_env=not heavy):
        command += " --record"
    return command, note


def _recordable(problem: Any, build_env: bool) -> bool:
    """Whether recorded episodes would have frames: an image observation, or (when building
    an eval env is cheap) an env that draws itself."""
    if any(spec.dtype == np.uint8 and len(spec.shape) == 3 and spec.shape[-1] == 3
           for spec in problem.observation_specs()):
        return True
    if not build_env:
        return False
    # Headless, as launch.evaluate draws: pygame (CartPole's renderer) then needs no display.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    env = problem.make_eval_env()
    try:
        obs, _ = env.reset(seed=0)
        observation = obs if isinstance(obs, dict) else {"observation": obs}
        return problem.render_frame({k: np.asarray(v) for k, v in observation.items()}, env) is not None
    finally:
        env.close()


def print_next_steps(logdir: str, tensorboard_port: int = 0, problem_name: str = "", problem: Any = None) -> None:
    """The commands that come next, written so that they work as printed on this machine."""
    running = f"  (running on http://localhost:{tensorboard_port})" if tensorboard_port else ""
    print(f"TensorBoard: {script('tensorboard')} --logdir {logdir}{running}")
    command, note = watch_command(logdir, problem_name, problem)
    print(f"Watch the trained policy: {command}")
    if note:
        print(f"  ({note})")
