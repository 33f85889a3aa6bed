"""Does training hold its policy past its peak? N seeds of one Problem, each for a fixed
number of env steps, with no early stop.

    python -m fleetrl.bench.stability --problem=cartpole --runs=10 --env_steps=1000000

The curve is `--tag` (default `episode/return`, the training episodes; `eval/...` tags
come from the eval rounds, so give `--launch_flag=--num_eval_actors=1`). Each run is
`launch.local` with the Problem's defaults (plus `--hparams` and any
`--launch_flag`) and its own
`--seed`, one after another (`--parallel` runs several at once; on 2 cores one at a time
keeps them from slowing each other). Per run it prints the mean return of the last 100
episodes at the end, the best summary point, when the curve first reached `--target`, and
the longest stretch after that in which it stayed below `--floor`. A run passes when it
ends at or above `--final` and no such stretch lasts `--max_dip_steps` or more.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import NamedTuple

import numpy as np
from absl import app, flags
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("problem", "cartpole", "Problem to train.")
    flags.DEFINE_list("hparams", [], "name=value overrides of the Problem's config, for every run.")
    flags.DEFINE_multi_string("launch_flag", [], "A flag for launch.local, for every run (repeat it): "
                                                 "--launch_flag=--batch_size=32.")
    flags.DEFINE_integer("runs", 10, "Seeds first_seed to first_seed + runs - 1.")
    flags.DEFINE_integer("first_seed", 0, "The first run's seed.")
    flags.DEFINE_integer("env_steps", 1_000_000, "Env steps per run.")
    flags.DEFINE_integer("parallel", 1, "Runs at once.")
    flags.DEFINE_string("tag", "episode/return", "The curve: a TensorBoard tag of the run, or of its eval "
                                                 "rounds (eval/...).")
    flags.DEFINE_float("target", 475.0, "The return that counts as solved.")
    flags.DEFINE_float("floor", 200.0, "A dip is a stretch below this after reaching the target.")
    flags.DEFINE_integer("max_dip_steps", 50_000, "A dip this long or longer fails the run, in the curve's steps "
                                                  "(env steps; policy versions for eval tags).")
    flags.DEFINE_float("final", 450.0, "The least mean return of the last 100 episodes at the end for a pass "
                                       "(with an eval --tag: the last eval round's value).")
    flags.DEFINE_string("keep_logdirs", None, "Keep each run's logdir (TensorBoard, checkpoints) as DIR/seed_N; "
                                              "default: temporary, deleted after the run.")


def at_least(value: float, threshold: float) -> bool:
    """TensorBoard keeps float32: a round at 0.95 reads back as 0.949999988, below the float 0.95."""
    return value >= float(np.float32(threshold))


class Run(NamedTuple):
    seed: int
    final: float
    best: float
    reached_at: int | None
    longest_dip: int
    lowest_after: float | None  # the lowest point once the target was reached

    @property
    def passed(self) -> bool:
        return at_least(self.final, FLAGS.final) and self.longest_dip < FLAGS.max_dip_steps


def longest_dip(curve: list[tuple[int, float]], reached_at: int | None) -> int:
    """Env steps of the longest stretch below the floor after `reached_at` (to the curve's end if it never recovers)."""
    if reached_at is None:
        return 0
    longest, start = 0, None
    for step, value in curve:
        if step < reached_at:
            continue
        if not at_least(value, FLAGS.floor) and start is None:
            start = step
        elif at_least(value, FLAGS.floor) and start is not None:
            longest, start = max(longest, step - start), None
    if start is not None:
        longest = max(longest, curve[-1][0] - start)
    return longest


def train(seed: int) -> Run:
    if FLAGS.keep_logdirs:
        logdir = os.path.join(FLAGS.keep_logdirs, f"seed_{seed}")
        os.makedirs(logdir, exist_ok=True)
        return train_in(seed, logdir)
    with tempfile.TemporaryDirectory() as logdir:
        return train_in(seed, logdir)


def train_in(seed: int, logdir: str) -> Run:
    hparams = [f"--hparams={','.join(FLAGS.hparams)}"] if FLAGS.hparams else []
    subprocess.run([sys.executable, "-m", "fleetrl.launch.local", f"--problem={FLAGS.problem}", f"--seed={seed}",
                    f"--logdir={logdir}", f"--total_env_steps={FLAGS.env_steps}", "--summary_interval_s=1",
                    *hparams, *FLAGS.launch_flag], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    evaluated = FLAGS.tag.startswith("eval/")
    events = EventAccumulator(os.path.join(logdir, "eval") if evaluated else logdir, size_guidance={"scalars": 0})
    events.Reload()
    curve = [(e.step, e.value) for e in events.Scalars(FLAGS.tag)]
    if evaluated:
        final = curve[-1][1]
    else:
        with open(os.path.join(logdir, "summary.json")) as f:
            final = json.load(f)["mean_episode_return"]  # null: no episode in the window
        final = float("nan") if final is None else final
    reached_at = next((step for step, value in curve if at_least(value, FLAGS.target)), None)
    lowest = min((value for step, value in curve if step >= reached_at), default=None) \
        if reached_at is not None else None
    return Run(seed, final, max(value for _, value in curve), reached_at, longest_dip(curve, reached_at), lowest)


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # its event reader logs every directory it polls
    settings = " ".join([",".join(FLAGS.hparams), *FLAGS.launch_flag]).strip() or "(defaults)"
    print(f"stability: {FLAGS.problem} {settings}, {FLAGS.runs} seeds x {FLAGS.env_steps:,} env steps, "
          f"{FLAGS.parallel} at a time, {os.cpu_count()} CPUs", flush=True)
    print(f"{'seed':>4} {'final':>7} {'best':>7} {'reached ' + format(FLAGS.target, 'g'):>12} "
          f"{'longest dip':>11} {'lowest after':>12} pass", flush=True)
    with concurrent.futures.ThreadPoolExecutor(FLAGS.parallel) as pool:
        runs = []
        for run in pool.map(train, range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.runs)):
            runs.append(run)
            reached = f"{run.reached_at:,}" if run.reached_at is not None else "never"
            lowest = f"{run.lowest_after:.3g}" if run.lowest_after is not None else "-"
            print(f"{run.seed:>4} {run.final:7.3g} {run.best:7.3g} {reached:>12} {run.longest_dip:11,} {lowest:>12} "
                  f"{'yes' if run.passed else 'no'}", flush=True)
    print(f"{sum(r.passed for r in runs)} of {len(runs)} passed: final {FLAGS.tag} >= {FLAGS.final:g} and no dip "
          f"below {FLAGS.floor:g} of {FLAGS.max_dip_steps:,} steps or more after reaching {FLAGS.target:g}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
